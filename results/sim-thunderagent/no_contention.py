"""The bound of Fig. 10's quick cells: the same cell with every trajectory alone on an engine
(engines >= trajectories in flight), nothing contending for a slot, KV or a decode batch.
No scheduler on the cell's 16 GPUs can make a trajectory faster than that, and the coordinator
(window, staleness, batch) is the same code, so its time to the last step bounds every system
of the cell from below.

    PYTHONPATH=src python results/sim-thunderagent/no_contention.py MODEL BATCH SEED SYSTEM OUT.jsonl
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

from venusrl.cli.simulate import _run
from venusrl.sim.scenarios import MODELS, fig10_cell


def main(model: str, batch: int, seed: int, system: str, out: Path) -> None:
    tp = dict(MODELS)[model]
    spec = fig10_cell(system, model, batch)
    in_flight = math.ceil(1.5 * batch) * spec.workload.group_size
    engines = 1 << math.ceil(math.log2(in_flight))  # a power of two >= the trajectories in flight
    spec = replace(spec, seed=seed, generation_gpus=engines * tp)
    result = _run(spec) | {"model": model, "batch": batch, "engines": engines, "bound": "no_contention"}
    with out.open("a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
