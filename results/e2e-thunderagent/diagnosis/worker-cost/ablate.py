"""Default cell ablation: which of venus's parts costs it against action_level."""
import json, sys
from dataclasses import replace
import venusrl.bench.rollout as R
V = R.SETUPS["venus"]
variants = {
    "venus_fcfs": replace(V, slot_mode="action_level", orchestration=False),
    "venus_lru": replace(V, cache_policy="lru", demotion=False, work_conservation=True),
    "venus_nolive": replace(V, live_set=None),
}
pick = sys.argv[3].split(",")
S = {"action_level": R.SETUPS["action_level"], "venus": V}
for name in pick: S[name] = variants[name]
R.SETUPS.clear(); R.SETUPS.update(S)
R.MODES = tuple(S); R.BASELINES = ("action_level",); R.VARIANTS = {"venus": ""}
res = R.run_case(False, repeats=int(sys.argv[1]), trainer_factors=(0.5,))
json.dump(res, open(sys.argv[2], "w"), indent=1)
al = [r["time_to_last_step_s"] for r in res["action_level"]["rounds"]]
for m in R.MODES:
    t = [r["time_to_last_step_s"] for r in res[m]["rounds"]]
    print(m, round(res[m]["time_to_last_step_s"], 2), "vs AL", [round(a / b, 3) for a, b in zip(al, t)],
          "preempt", [r["preemptions"] for r in res[m]["rounds"]], res["breakdown"][m]["fractions"])
