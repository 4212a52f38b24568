"""venus alone in one of Fig. 10's quick cells (coarsening 1), one seed, appended to OUT (JSONL):

    PYTHONPATH=src python results/sim-thunderagent/venus_cells.py MODEL BATCH SEED OUT.jsonl
"""
import json, sys
from dataclasses import replace
from venusrl.cli.simulate import _run
from venusrl.sim.scenarios import fig10
from venusrl.sim.workload import WorkloadConfig
model, batch, seed, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for case in fig10(True, WorkloadConfig()):
    if case.label["model"] == model and case.label["batch"] == batch:
        (spec,) = [s for s in case.specs if s.system.name == "venus"]
        r = _run(replace(spec, seed=seed)) | {"model": model, "batch": batch}
        open(out, "a").write(json.dumps(r) + "\n")
