"""One row of the `coarsening` scenario (`sim/scenarios.py: COARSENING`), each system under
each seed run one after the other, every run's result appended to OUT.jsonl as it ends (a
row at coarsening 1 takes the better part of an hour on the shared 2-core machine, so a
stopped run keeps what it finished); then OUT.json with the scenario's table of that row.

    python results/sim-coarsening/run_row.py coarsen_1 --seeds 2 --out results/sim-coarsening/coarsen_1
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from venusrl.cli.simulate import INVERTED, _run
from venusrl.sim.report import rows
from venusrl.sim.scenarios import COARSENING, _cell_under
from venusrl.sim.workload import WorkloadConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("row", choices=list(COARSENING))
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    (case,) = _cell_under([(args.row, COARSENING[args.row])], WorkloadConfig(), None)
    specs = [replace(spec, seed=seed) for seed in range(args.seeds) for spec in case.specs]
    done = args.out.with_suffix(".jsonl")
    results = [json.loads(line) for line in done.read_text().splitlines()] if done.exists() else []
    for spec in specs[len(results):]:
        results.append(_run(spec))
        with done.open("a") as f:
            f.write(json.dumps(results[-1]) + "\n")
    cases = [{"label": case.label, "runs": results}]
    table = rows(cases, "venus", invert="coarsening" in INVERTED)
    args.out.with_suffix(".json").write_text(json.dumps({"row": args.row, "table": table, "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
