"""One run of a `coarsening` row (`sim/scenarios.py: COARSENING`): `system` under `seed`, its
result appended to OUT (a JSONL file, one line a run, as `run_row.py` writes). Two of these at
once use both cores where `run_row.py` runs one after another.

    python results/sim-coarsening/run_one.py coarsen_1 1 venus /tmp/coarsen_1_seed1_venus.jsonl
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from venusrl.cli.simulate import _run
from venusrl.sim.scenarios import COARSENING, _cell_under
from venusrl.sim.workload import WorkloadConfig


def main(row: str, seed: int, system: str, out: Path) -> None:
    (case,) = _cell_under([(row, COARSENING[row])], WorkloadConfig(), None)
    (spec,) = [replace(spec, seed=seed) for spec in case.specs if spec.system.name == system]
    result = _run(spec)
    with out.open("a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
