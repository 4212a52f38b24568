"""PYTHONPATH=src python multi.py TAG PRESET SEEDS MODEL BATCH [key=value ...]  (env passes through) -> runs.jsonl beside this script"""
import sys, json, os, yaml
from concurrent.futures import ProcessPoolExecutor
from venusrl.sim.run import simulate
from venusrl.sim.scenarios import fig10_cell
tag, preset, seeds, model, batch = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
extra = {a.split('=',1)[0]: yaml.safe_load(a.split('=',1)[1]) for a in sys.argv[6:]}
def one(seed):
    spec = fig10_cell(preset, model, batch, settings=extra, seed=seed)
    r = simulate(spec).to_dict()
    return {"tag": tag, "preset": preset, "model": model, "batch": batch, "seed": seed, "t": r["sim_seconds"], "steps": r["step_times"], "busy": r["engine"]["busy_fraction"], "mig": r["worker"]["migrations"], "wall": r["wall_s"]}
if __name__ == "__main__":
    import logging; logging.disable(logging.INFO)
    ss = [int(x) for x in seeds.split(",")]
    with ProcessPoolExecutor(2) as ex:
        for row in ex.map(one, ss):
            print(json.dumps(row)); open(str(__import__("pathlib").Path(__file__).with_name("runs.jsonl")), "a").write(json.dumps(row) + "\n")
