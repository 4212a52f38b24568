"""Per-thread CPU of the rollout process over one round per mode (from /proc/self/task)."""
import os, sys, collections, threading
from dataclasses import replace
import venusrl.bench.rollout as R
V = R.SETUPS["venus"]
S = {"action_level": R.SETUPS["action_level"], "venus": V}
R.SETUPS.clear(); R.SETUPS.update(S)
R.MODES = tuple(S); R.BASELINES = ("action_level",); R.VARIANTS = {"venus": ""}
TICK = os.sysconf("SC_CLK_TCK")
def snap():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{tid}/stat").read()
            comm = stat[stat.index("(") + 1: stat.rindex(")")]
            f = stat[stat.rindex(")") + 2:].split()
            out[tid] = (comm, (int(f[11]) + int(f[12])) / TICK)
        except FileNotFoundError:
            pass
    return out
orig = R._round
async def wrapped(model_dir, case, mode, *a, **k):
    a0 = snap()
    r = await orig(model_dir, case, mode, *a, **k)
    b = snap()
    by = collections.Counter()
    for tid, (comm, cpu) in b.items():
        by[comm + '-' + tid + ('*' if tid not in a0 else '')] += cpu - a0.get(tid, (comm, 0.0))[1]
    print(f"== {mode} t={r.figures['time_to_last_step_s']:.2f}", {k: round(v, 2) for k, v in by.most_common() if v > 0.005}, flush=True)
    return r
R._round = wrapped
R.run_case(False, repeats=int(sys.argv[1]), trainer_factors=(0.5,))
