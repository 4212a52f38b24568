"""Default cell: venus with the interpreter's switch interval at its 5 ms default and at 0.5 ms
(the predictor thread's GIL hand-offs against the event loop)."""
import json, sys
import venusrl.bench.rollout as R
V = R.SETUPS["venus"]
S = {"action_level": R.SETUPS["action_level"], "venus": V, "venus_swi": V}
R.SETUPS.clear(); R.SETUPS.update(S)
R.MODES = tuple(S); R.BASELINES = ("action_level",); R.VARIANTS = {"venus": "", "venus_swi": "swi_"}
orig = R._round
async def flagged(model_dir, case, mode, *a, **k):
    sys.setswitchinterval(float(sys.argv[3]) if mode == "venus_swi" else 0.005)
    try:
        return await orig(model_dir, case, mode, *a, **k)
    finally:
        sys.setswitchinterval(0.005)
R._round = flagged
res = R.run_case(False, repeats=int(sys.argv[1]), trainer_factors=(0.5,))
json.dump(res, open(sys.argv[2], "w"), indent=1)
al = [r["time_to_last_step_s"] for r in res["action_level"]["rounds"]]
for m in R.MODES:
    t = [r["time_to_last_step_s"] for r in res[m]["rounds"]]
    print(m, round(res[m]["time_to_last_step_s"], 2), "vs AL", [round(a / b, 3) for a, b in zip(al, t)], res["breakdown"][m]["idle_split"]["fractions"])
