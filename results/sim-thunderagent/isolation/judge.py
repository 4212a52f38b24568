"""Isolation's runs (runs.jsonl) against venus without it, paired by cell, seed and perturbation:
per cell the geometric mean of the paired time ratios, how many runs finished sooner, each seed's
median and each pair. The baselines are the committed venus runs of the tables before isolation:
../six-seeds/fig10_quick_s6.json and ../perturbations/ (perturbation 0 of seeds 0-5 and 1-2 of
seeds 0-1), ../perturbations/runs_4b_b16.jsonl via twelve_seeds.py (4B batch 16, seeds 0-11) and
../cell-anatomy/variants_runs.jsonl (tags pms1 / pms2: 32B batch 16, perturbations 1-2 of seeds 2-5).

    python results/sim-thunderagent/isolation/judge.py [TAG]   (default: gated)
"""

import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "perturbations"))
import twelve_seeds  # noqa: E402


def baselines() -> dict[tuple[str, int, int, int], float]:
    """(model, batch, seed, perturbation) -> venus's simulated seconds to the last step."""
    out = {("qwen3-4b", 16, s, k): t for (name, s, k), t in twelve_seeds.runs().items() if name == "venus"}
    for table in (HERE.parent / "six-seeds" / "fig10_quick_s6.json", HERE.parent / "perturbations" / "fig10_quick_c1_p3.json"):
        for case in json.loads(table.read_text())["cases"]:
            for run in case["runs"]:
                if run["name"] == "venus":
                    key = (case["label"]["model"], case["label"]["batch"], run["seed"], run.get("perturbation", 0))
                    out.setdefault(key, run["sim_seconds"])
    for line in (HERE.parent / "cell-anatomy" / "variants_runs.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["tag"] in ("pms1", "pms2") and row["preset"] == "venus":
            out.setdefault((row["model"], row["batch"], row["seed"], int(row["tag"][-1])), row["t"])
    return out


def main() -> None:
    tag = sys.argv[1] if len(sys.argv) > 1 else "gated"
    base = baselines()
    cells: dict[tuple[str, int], list[tuple[int, int, float]]] = {}
    for line in (HERE / "runs.jsonl").read_text().splitlines():
        row = json.loads(line)
        key = (row["model"], row["batch"], row["seed"], row["perturbation"])
        if row["tag"] == tag and key in base:
            cells.setdefault(key[:2], []).append((row["seed"], row["perturbation"], row["t"] / base[key]))
    print("| model | batch | runs | sooner | time, geometric mean | median of seed medians | seed: ratio per perturbation |")
    print("|---|---|---|---|---|---|---|")
    for (model, batch), pairs in sorted(cells.items()):
        geo = math.exp(statistics.mean(math.log(r) for *_, r in pairs))
        seeds = sorted({s for s, *_ in pairs})
        medians = [statistics.median(r for s2, _, r in pairs if s2 == s) for s in seeds]
        detail = "; ".join(f"{s}: " + " / ".join(f"{r:.3f}" for s2, _, r in sorted(pairs) if s2 == s) for s in seeds)
        print(f"| {model} | {batch} | {len(pairs)} | {sum(r < 1 for *_, r in pairs)} | {geo - 1:+.2%} | "
              f"{statistics.median(medians) - 1:+.2%} | {detail} |")
    against_thunderagent(tag)


def against_thunderagent(tag: str) -> None:
    """4B batch 16, twelve seeds x three perturbations: venus / ThunderAgent without and with
    the runs of `tag` (the median of the seeds' medians, and the lowest run)."""
    runs = twelve_seeds.runs()
    with_tag = {(row["seed"], row["perturbation"]): row["t"] for row in map(json.loads, (HERE / "runs.jsonl").read_text().splitlines())
                if row["tag"] == tag and (row["model"], row["batch"]) == ("qwen3-4b", 16)}
    if len(with_tag) < 36:
        return
    for name, venus in (("without", {(s, k): runs["venus", s, k] for s in range(12) for k in range(3)}), (tag, with_tag)):
        ratio = {key: runs[("thunderagent", *key)] / t for key, t in venus.items()}
        medians = [statistics.median(ratio[s, k] for k in range(3)) for s in range(12)]
        print(f"4B batch 16, venus / ThunderAgent, {name}: median of seed medians {statistics.median(medians):.3f}, "
              f"lowest run {min(ratio.values()):.3f}, runs >= 1.15x {sum(r >= 1.15 for r in ratio.values())} of 36, "
              f"seeds 0 / 1 {medians[0]:.3f} / {medians[1]:.3f}")


if __name__ == "__main__":
    main()
