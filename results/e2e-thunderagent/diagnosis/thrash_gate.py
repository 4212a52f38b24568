"""venus with a thrash-gated live set against venus as it is (run in the `venus_no_moves` slot)
and action_level, trainer 0.5x, paired repeats. Needs `thrash_gate.patch` applied (not kept in
the code): an engine's live set pauses nothing until the engine's recomputed tokens exceed
THETA of the prefill tokens it computed (cumulative, once it has computed a pool's worth);
then it latches on. THETA < 0: always on (venus as it is).

    git apply results/e2e-thunderagent/diagnosis/thrash_gate.patch
    PYTHONPATH=src python results/e2e-thunderagent/diagnosis/thrash_gate.py default|kv|tail REPEATS THETA OUT.json
"""
import json, os, sys
import venusrl.bench.rollout as R
cell, repeats, theta, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
R.SETUPS["venus_no_moves"] = R.SETUPS["venus"]
del R.SETUPS["trajectory_level"]; del R.SETUPS["thunderagent"]
R.MODES = tuple(R.SETUPS); R.BASELINES = ("action_level",)
orig = R._round
async def flagged(model_dir, case, mode, *a, **k):
    os.environ["THRASH_THETA"] = theta if mode == "venus" else "-1"
    return await orig(model_dir, case, mode, *a, **k)
R._round = flagged
kw = dict(repeats=repeats, trainer_factors=(0.5,))
if cell == "kv": kw.update(slots_per_engine=1, test_log_lines=3, kv_tokens_per_engine=6000, tool_latency_mean_s=0.05)
if cell == "tail": kw.update(slots_per_engine=1, max_turns=20)
res = R.run_case(cell == "tail", **kw)
json.dump(res, open(out, "w"), indent=1)
for k, v in res.items():
    if k.endswith("end_to_end_speedup_vs_action_level_per_repeat"): print(k, [round(x, 3) for x in v])
for m in R.MODES: print(m, round(res[m]["time_to_last_step_s"], 2), res[m]["breakdown"]["fractions"], res[m]["tokens"])
