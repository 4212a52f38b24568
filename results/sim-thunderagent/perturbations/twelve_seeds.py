"""Venus / ThunderAgent at Fig. 10's Qwen3-4B batch 16, twelve seeds x three perturbations, from
the committed runs: perturbation 0 of seeds 0-5 (../six-seeds/fig10_quick_s6.json) and 6-11
(../cell-anatomy/variants_runs.jsonl, tags clean / seeds6_11), perturbations 1-2 of seeds 0-1
(fig10_quick_c1_p3.json) and 2-11 (runs_4b_b16.jsonl, tags pms1 / pms2).

    python results/sim-thunderagent/perturbations/twelve_seeds.py
"""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
SYSTEMS = ("venus", "thunderagent")


def runs() -> dict[tuple[str, int, int], float]:
    """(system, seed, perturbation) -> simulated seconds to the last step."""
    out: dict[tuple[str, int, int], float] = {}
    for table, perturbed_only in ((HERE.parent / "six-seeds" / "fig10_quick_s6.json", False),
                                  (HERE / "fig10_quick_c1_p3.json", True)):
        for case in json.loads(table.read_text())["cases"]:
            if (case["label"]["model"], case["label"]["batch"]) == ("qwen3-4b", 16):
                for run in case["runs"]:
                    k = run.get("perturbation", 0)
                    if run["name"] in SYSTEMS and (k > 0 or not perturbed_only):
                        out[run["name"], run["seed"], k] = run["sim_seconds"]
    for path, tags in ((HERE.parent / "cell-anatomy" / "variants_runs.jsonl", {"clean": 0, "seeds6_11": 0}),
                       (HERE / "runs_4b_b16.jsonl", {"pms1": 1, "pms2": 2})):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row["tag"] in tags and (row["model"], row["batch"]) == ("qwen3-4b", 16) and row["preset"] in SYSTEMS:
                out[row["preset"], row["seed"], tags[row["tag"]]] = row["t"]
    return out


def main() -> None:
    t = runs()
    ratios = {(s, k): t["thunderagent", s, k] / t["venus", s, k] for s in range(12) for k in range(3)}
    print("seed | venus s (perturbation 0 / 1 / 2) | ThunderAgent s | venus / ThunderAgent | seed's median")
    for s in range(12):
        r = [ratios[s, k] for k in range(3)]
        venus, thunderagent = ([f"{t[name, s, k]:,.0f}" for k in range(3)] for name in SYSTEMS)
        print(f"{s} | {' / '.join(venus)} | {' / '.join(thunderagent)} | "
              f"{' / '.join(f'{x:.3f}' for x in r)} | {statistics.median(r):.3f}")
    medians = [statistics.median(ratios[s, k] for k in range(3)) for s in range(12)]
    every = list(ratios.values())
    print(f"median of the seeds' medians {statistics.median(medians):.3f}; median of all {len(every)} runs "
          f"{statistics.median(every):.3f}; lowest {min(every):.3f}; runs at 1.15x or more: "
          f"{sum(x >= 1.15 for x in every)} of {len(every)}; per perturbation: "
          + ", ".join(f"{k}: {statistics.median(ratios[s, k] for s in range(12)):.3f}" for k in range(3)))


if __name__ == "__main__":
    main()
