"""One cell of the rollout bench, venus with and without isolation of the step enders (and any
other modes named), paired and rotated as the bench rotates them; prints each venus round's
moves by reason and how often isolation found the pool with room (`RolloutCore.moves_by_reason`,
`room_readings`, also in each round's figures).
argv: repeats out.json mode[,mode...] [key=value overrides of the case]; QUICKCASE=1 in the
environment starts from the quick case (the long-tail cell). Mode venus_no_isolation: venus
with `rollout.isolate_step_enders: false`."""
import json
import os
import sys
from functools import partial

import venusrl.bench.rollout as R

modes = sys.argv[3].split(",")
base = R.QUICK if os.environ.get("QUICKCASE") else R.FULL
overrides = {k: type(getattr(base, k))(v) for k, v in (a.split("=") for a in sys.argv[4:])}
R.SETUPS["venus_no_isolation"] = R.SETUPS["venus"]
S = {m: R.SETUPS[m] for m in dict.fromkeys(["action_level", *modes])}
R.SETUPS.clear()
R.SETUPS.update(S)
R.MODES = tuple(S)
R.BASELINES = ("action_level",)
R.VARIANTS = {m: ("" if m == "venus" else f"{m}_") for m in S if m != "action_level"}
config, round_ = R.RolloutConfig, R._round


async def wrapped(model_dir, case, mode, *a, **k):
    R.RolloutConfig = partial(config, isolate_step_enders=False) if mode == "venus_no_isolation" else config
    try:
        r = await round_(model_dir, case, mode, *a, **k)
    finally:
        R.RolloutConfig = config
    keys = ("time_to_last_step_s", "migrations", "moves_by_reason", "room_readings")
    print("==", json.dumps({"mode": mode, **{key: r.figures[key] for key in keys}}), flush=True)
    return r


R._round = wrapped
res = R.run_case(bool(os.environ.get("QUICKCASE")), repeats=int(sys.argv[1]), trainer_factors=(0.5,), **overrides)
json.dump(res, open(sys.argv[2], "w"), indent=1)
for k, v in res.items():
    if "end_to_end_speedup" in k and k.endswith("per_repeat"):
        print(k, [round(x, 3) for x in v])
