"""PYTHONPATH=src python multi.py TAG PRESET SEEDS MODEL BATCH [policy=P] [spec.FIELD=v] [config.key=v ...]
(env passes through) -> one row per seed, appended to $RUNS_OUT (default: runs.jsonl beside this script)"""
import json
import logging
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from venusrl.sim.run import simulate
from venusrl.sim.scenarios import fig10_cell

tag, preset, seeds, model, batch = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
extra = {a.split('=', 1)[0]: yaml.safe_load(a.split('=', 1)[1]) for a in sys.argv[6:]}
policy = extra.pop("policy", None)
fields = {k[5:]: extra.pop(k) for k in list(extra) if k.startswith("spec.")}
out = Path(os.environ.get("RUNS_OUT", Path(__file__).with_name("runs.jsonl")))


def one(seed):
    logging.disable(logging.INFO)
    spec = fig10_cell(preset, model, batch, settings=extra, seed=seed, policy=policy, **fields)
    r = simulate(spec).to_dict()
    return {"tag": tag, "preset": preset, "model": model, "batch": batch, "seed": seed, "t": round(r["sim_seconds"], 1),
            "steps": [round(x) for x in r["step_times"]], "busy": r["engine"]["busy_fraction"],
            "mig": r["worker"]["migrations"], "wall": round(r["wall_s"])}


if __name__ == "__main__":
    with ProcessPoolExecutor(2) as ex:
        for row in ex.map(one, [int(x) for x in seeds.split(",")]):
            print(json.dumps(row), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
