"""One preset in one Fig. 10 quick cell at coarsening 1, one seed, appended to OUT (JSONL).
    PYTHONPATH=src python results/sim-thunderagent/decode-priority/preset_cell.py MODEL BATCH SEED PRESET OUT.jsonl [key=value ...]"""
import json, sys, time
from venusrl.cli.simulate import _run
import yaml
from venusrl.sim.scenarios import fig10_cell
model, batch, seed, preset, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
extra = {a.split('=',1)[0]: yaml.safe_load(a.split('=',1)[1]) for a in sys.argv[6:]}
spec = fig10_cell(preset, model, batch, settings=extra, seed=seed)
t = time.time()
r = _run(spec)
keep = {k: v for k, v in r.items() if not isinstance(v, (list, dict)) or k in ("step_times", "steps")}
open(out, "a").write(json.dumps({"model": model, "batch": batch, "seed": seed, "preset": preset, "extra": extra, "wall": time.time() - t, **r}) + "\n")
print(preset, extra, model, batch, seed, {k: v for k, v in r.items() if isinstance(v, (int, float))})
