"""Default cell: venus with and without its learned predictor, and FCFS slots with it."""
import json, sys
from dataclasses import replace
import venusrl.bench.rollout as R
V = R.SETUPS["venus"]
S = {"action_level": R.SETUPS["action_level"], "venus": V, "venus_nopred": V,
     "venus_fcfs": replace(V, slot_mode="action_level", orchestration=False)}
R.SETUPS.clear(); R.SETUPS.update(S)
R.MODES = tuple(S); R.BASELINES = ("action_level",); R.VARIANTS = {"venus": "", "venus_fcfs": "fcfs_"}
res = R.run_case(False, repeats=int(sys.argv[1]), trainer_factors=(0.5,))
json.dump(res, open(sys.argv[2], "w"), indent=1)
al = [r["time_to_last_step_s"] for r in res["action_level"]["rounds"]]
for m in R.MODES:
    t = [r["time_to_last_step_s"] for r in res[m]["rounds"]]
    print(m, round(res[m]["time_to_last_step_s"], 2), "vs AL", [round(a / b, 3) for a, b in zip(al, t)],
          "preempt", [r["preemptions"] for r in res[m]["rounds"]], res["breakdown"][m]["fractions"]["idle"])
