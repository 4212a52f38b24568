"""Default cell (or overrides), chosen modes only, N repeats; prints each round's wall and CPU.
argv: repeats out.json mode[,mode...] [key=value overrides of the case]; QUICKCASE=1 in the
environment starts from the quick case instead of the full one (the long-tail cell).
Mode venus_nopreempt: venus whose urgent turns wait first in line instead of preempting.
The rollout process's CPU by thread is the bench's own figure (`cpu_s.rollout_threads`) now;
the runs here read the same /proc/self/task counters from this script."""
import json, os, sys
import venusrl.bench.rollout as R
from venusrl.rollout.slots import SlotScheduler
modes = sys.argv[3].split(",")
overrides = {k: type(getattr(R.FULL, k))(v) for k, v in (a.split("=") for a in sys.argv[4:])}
R.SETUPS["venus_nopreempt"] = R.SETUPS["venus"]
S = {m: R.SETUPS[m] for m in dict.fromkeys(["action_level", *modes])}
R.SETUPS.clear(); R.SETUPS.update(S)
R.MODES = tuple(modes); R.BASELINES = ("action_level",) if "action_level" in S else ()
R.VARIANTS = {m: ("" if m == "venus" else f"{m}_") for m in modes if m != "action_level"}
orig_preempt = SlotScheduler._preempt_for
orig_round = R._round
async def wrapped(model_dir, case, mode, *a, **k):
    if mode == "venus_nopreempt":
        SlotScheduler._preempt_for = lambda self, t: None
    try:
        r = await orig_round(model_dir, case, mode, *a, **k)
    finally:
        SlotScheduler._preempt_for = orig_preempt
    f = r.figures
    print("   threads", {k: v for k, v in f["cpu_s"]["rollout_threads"].items() if v > 0.02}, flush=True)
    print(f"== {mode} t={f['time_to_last_step_s']:.2f} first={f['time_to_first_batch_s']:.2f} cpu rollout={f['cpu_s']['rollout']:.2f} "
          f"engines={[round(x,2) for x in f['cpu_s']['engines']]} preempt={f['preemptions']} sampled={f['tokens']['sampled']}", flush=True)
    return r
R._round = wrapped
res = R.run_case(bool(os.environ.get("QUICKCASE")), repeats=int(sys.argv[1]), trainer_factors=(0.5,), **overrides)
json.dump(res, open(sys.argv[2], "w"), indent=1)
for k, v in res.items():
    if "end_to_end_speedup" in k and ("per_repeat" in k or k.endswith("action_level")):
        print(k, v)
