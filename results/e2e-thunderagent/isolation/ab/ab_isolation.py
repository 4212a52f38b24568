"""One cell of the rollout bench, venus with and without isolation of the step enders (and any
other modes named), paired and rotated as the bench rotates them; prints each venus round's
moves by reason and how often isolation found the pool with room (`RolloutCore.moves_by_reason`,
`room_readings`, also in each round's figures).
argv: repeats out.json mode[,mode...] [key=value overrides of the case]; QUICKCASE=1 in the
environment starts from the quick case (the long-tail cell). Mode venus_no_isolation: venus
with `rollout.isolate_step_enders: false`; venus_no_preemption: venus whose urgent turns wait
first in line instead of preempting a LOW holder (`SlotScheduler._preempt_for` returns None);
venus_no_moves: the bench's own."""
import json
import os
import sys
from functools import partial

import venusrl.bench.rollout as R
from venusrl.rollout.slots import SlotScheduler

modes = sys.argv[3].split(",")
base = R.QUICK if os.environ.get("QUICKCASE") else R.FULL
overrides = {k: type(getattr(base, k))(v) for k, v in (a.split("=") for a in sys.argv[4:])}
R.SETUPS["venus_no_isolation"] = R.SETUPS["venus_no_preemption"] = R.SETUPS["venus"]
S = {m: R.SETUPS[m] for m in dict.fromkeys(["action_level", *modes])}
R.SETUPS.clear()
R.SETUPS.update(S)
R.MODES = tuple(S)
R.BASELINES = ("action_level",)
R.VARIANTS = {m: ("" if m == "venus" else f"{m}_") for m in S if m != "action_level"}
config, round_, preempt_for = R.RolloutConfig, R._round, SlotScheduler._preempt_for


async def wrapped(model_dir, case, mode, *a, **k):
    R.RolloutConfig = partial(config, isolate_step_enders=False) if mode == "venus_no_isolation" else config
    if mode == "venus_no_preemption":
        SlotScheduler._preempt_for = lambda self, trajectory: None
    try:
        r = await round_(model_dir, case, mode, *a, **k)
    finally:
        R.RolloutConfig, SlotScheduler._preempt_for = config, preempt_for
    keys = ("time_to_last_step_s", "migrations", "moves_by_reason", "room_readings")
    print("==", json.dumps({"mode": mode, **{key: r.figures[key] for key in keys}}), flush=True)
    return r


R._round = wrapped
res = R.run_case(bool(os.environ.get("QUICKCASE")), repeats=int(sys.argv[1]), trainer_factors=(0.5,), **overrides)
json.dump(res, open(sys.argv[2], "w"), indent=1)
for k, v in res.items():
    if "end_to_end_speedup" in k and k.endswith("per_repeat"):
        print(k, [round(x, 3) for x in v])
