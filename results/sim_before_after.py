"""Side by side: the simulator's figures before and after the RolloutCore refactor (issue 19),
same scenarios, same seeds. Usage: python results/sim_before_after.py [results/sim-before]
[results/sim-after]. Prints one markdown row per (scenario, case, system, seed) and a line
per scenario saying how many runs are identical in every simulated figure (wall time and
events per second are the host's, not the simulation's, and are left out)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HOST_FIELDS = {"wall_s", "events_per_s"}


def runs(path: Path) -> dict[tuple, dict]:
    data = json.loads(path.read_text())
    out = {}
    for case in data["cases"]:
        label = ", ".join(f"{k}={v}" for k, v in case["label"].items())
        for run in case["runs"]:
            out[(label, run["name"], run.get("seed", 0))] = run
    return out


def simulated(run: dict) -> dict:
    return {k: v for k, v in run.items() if k not in HOST_FIELDS}


def main(before_dir: Path, after_dir: Path) -> None:
    print("| scenario | case | system | seed | tok/s before | tok/s after | sim s before | sim s after "
          "| preemptions b/a | migrations b/a | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = []
    for name in ("table1-quick.json", "fig10-quick.json"):
        before, after = runs(before_dir / name), runs(after_dir / name)
        if before.keys() != after.keys():
            raise SystemExit(f"{name}: the runs differ ({sorted(before.keys() ^ after.keys())})")
        same = 0
        for key in before:
            b, a = before[key], after[key]
            identical = simulated(b) == simulated(a)
            same += identical
            print(f"| {name.removesuffix('-quick.json')} | {key[0]} | {key[1]} | {key[2]} "
                  f"| {b['throughput_tokens_per_s']:,.1f} | {a['throughput_tokens_per_s']:,.1f} "
                  f"| {b['sim_seconds']:,.1f} | {a['sim_seconds']:,.1f} "
                  f"| {b['worker']['preemptions']}/{a['worker']['preemptions']} "
                  f"| {b['worker']['migrations']}/{a['worker']['migrations']} | {'yes' if identical else 'NO'} |")
        summary.append(f"{name}: {same} of {len(before)} runs identical in every simulated figure")
    print()
    print("\n".join(summary))


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]] or [Path("results/sim-before"), Path("results/sim-after")]
    main(*args)
