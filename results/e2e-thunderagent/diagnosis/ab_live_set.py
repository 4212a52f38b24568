"""A/B of venus's live set on the real rollout bench: action_level, thunderagent, venus, and
venus without its live set (`live_set=None`, run in the `venus_no_moves` slot, so its keys read
`venus_no_moves_*`), trainer 0.5x only, paired repeats, interleaved as the bench runs them:

    PYTHONPATH=src python results/e2e-thunderagent/diagnosis/ab_live_set.py default|kv|tail REPEATS OUT.json [nota]
"""
import json, sys
from dataclasses import replace
import venusrl.bench.rollout as R
cell, repeats, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
R.SETUPS["venus_no_moves"] = replace(R.SETUPS["venus"], live_set=None)
del R.SETUPS["trajectory_level"]
if len(sys.argv) > 4 and sys.argv[4] == "nota": del R.SETUPS["thunderagent"]
R.MODES = tuple(R.SETUPS)
R.BASELINES = tuple(b for b in R.BASELINES if b in R.SETUPS)
kw = dict(repeats=repeats, trainer_factors=(0.5,))
if cell == "kv": kw.update(slots_per_engine=1, test_log_lines=3, kv_tokens_per_engine=6000, tool_latency_mean_s=0.05)
if cell == "tail": kw.update(slots_per_engine=1, max_turns=20)
res = R.run_case(cell == "tail", **kw)
json.dump(res, open(out, "w"), indent=1)
for k, v in res.items():
    if k.endswith("end_to_end_speedup_vs_action_level_per_repeat") or k.endswith("end_to_end_speedup_vs_thunderagent_per_repeat"): print(k, [round(x, 3) for x in v])
for m in R.MODES: print(m, round(res[m]["time_to_last_step_s"], 2), res[m]["breakdown"]["fractions"])
