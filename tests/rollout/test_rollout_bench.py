import asyncio
import json

import pytest

from venusrl.bench.rollout import MODES, QUICK, RolloutCase, _prompts, _rollout, run
from venusrl.model.tiny import make_tiny_model
from venusrl.sim.workload import read_trace


@pytest.mark.slow
def test_quick_rollout_bench_reports_every_mode(tmp_path):
    result = run(quick=True)
    assert set(MODES) <= set(result)
    for name in MODES:
        (only,) = result[name]["rounds"]  # QUICK runs every mode once
        done = only["batch_done_s"]
        assert len(done) == QUICK.steps and done == sorted(done) and only["time_to_batch_s"] == done[0] > 0
        window = QUICK.batch_groups * (QUICK.steps - 1) / (done[-1] - done[0]) * 60
        assert only["groups_per_minute"] == pytest.approx(window)
        assert result[name]["time_to_batch_s"] == only["time_to_batch_s"]
        assert result[name]["groups_per_minute"] == only["groups_per_minute"]
    assert result["trajectory_level"]["rounds"][0]["preemptions"] == result["action_level"]["rounds"][0]["preemptions"] == 0
    assert result["speedup_vs_action_level_per_repeat"] == [result["speedup_vs_action_level"]]
    assert result["speedup_vs_action_level"] > 0 and result["window_speedup_vs_trajectory_level"] > 0
    json.dumps(result)


def test_a_round_records_its_turns_as_a_trace_the_simulator_replays(tmp_path):
    case = RolloutCase(batch_groups=2, group_size=2, async_factor=1.0, engines=1, slots_per_engine=2,
                       kv_tokens_per_engine=4000, tokens_per_turn=4, tool_latency_mean_s=0.01, max_turns=2, steps=2)
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    result = asyncio.run(_rollout(model_dir, case, "action_level", trace=True))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in result["trace"]))
    groups = read_trace(path)
    prompts = [p.id for p in _prompts(case, 4)]
    assert [row["prompt"] for row in result["trace"]][0] == prompts[0]  # the dataset's order
    assert len(groups[0]) == len(groups[1]) == 2  # the first batch: both groups, done
    for plan in (*groups[0], *groups[1]):
        assert plan.prompt_tokens > plan.shared_prompt_tokens > 0  # the system prompt and tools are shared
        assert len(plan.turns) >= 1 and all(1 <= t.gen_tokens <= case.tokens_per_turn for t in plan.turns)
    assert "trace" not in asyncio.run(_rollout(model_dir, case, "action_level"))
