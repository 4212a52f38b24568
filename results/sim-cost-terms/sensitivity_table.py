"""A sensitivity (or coarsening) JSON as the README's table: per row, venus's speedup in time
to the last step over each baseline (median of the per-seed ratios, the change from the first
row, each seed's ratio) and the engines' hit rates at seed 0.
Usage: python results/sim-cost-terms/sensitivity_table.py JSON"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

BASELINES = ("slime", "rollflash", "thunderagent")


def main(path: Path) -> None:
    data = json.loads(path.read_text())
    print("| row | " + " | ".join(f"venus / {b}" for b in BASELINES)
          + " | hit rate " + " / ".join((*BASELINES, "venus")) + " (seed 0) |")
    print("|---|" + "---|" * (len(BASELINES) + 1))
    first = None
    for case in data["cases"]:
        runs = case["runs"]
        seeds = sorted({r["seed"] for r in runs})
        done = {(r["name"], r["seed"]): r["sim_seconds"] for r in runs}
        per_seed = {b: [done[(b, s)] / done[("venus", s)] for s in seeds] for b in BASELINES}
        median = {b: statistics.median(v) for b, v in per_seed.items()}
        first = first or median
        cells = [f"{median[b]:.2f}x ({median[b] - first[b]:+.2f}; seeds {', '.join(f'{v:.2f}' for v in per_seed[b])})"
                 for b in BASELINES]
        hits = " / ".join(f"{r['engine']['hit_rate']:.2f}" for r in runs if r["seed"] == 0)
        print(f"| {case['label']['variant']} | " + " | ".join(cells) + f" | {hits} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
