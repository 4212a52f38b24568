"""The validation replays the rollout bench's own tasks: a synthetic trace follows each
episode's plan (turns and tool latencies) with the chat template's lengths."""

from __future__ import annotations

from venusrl.bench import sim_validation as validate
from venusrl.bench.rollout import QUICK, tasks
from venusrl.bench.workload import plan_episode
from venusrl.model.tiny import make_tiny_model
from venusrl.sim.cost_model import CostModel


def test_a_synthetic_trace_follows_the_bench_plans(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    prompts = tasks(QUICK, seed=0)[:3]
    shape = validate.chat_shape(model_dir, QUICK, prompts)
    rows = validate.trace_rows(QUICK, shape, prompts)
    assert 0 < shape.shared_prompt_tokens < min(shape.prompt_tokens.values())
    for prompt in prompts:
        for index in range(QUICK.group_size):
            plan = plan_episode(prompt.row(), index)
            turns = [r for r in rows if r["prompt"] == prompt.id and r["index"] == index]
            assert len(turns) == plan.turns
            assert [r["tool_seconds"] for r in turns[:-1]] == list(plan.latencies_s)
            assert turns[-1]["tool_seconds"] == 0.0 and turns[-1]["obs_tokens"] == 0
            assert all(1 <= r["gen_tokens"] <= QUICK.tokens_per_turn for r in turns)


def test_every_bench_mode_simulates_its_synthetic_round(tmp_path):
    """Each bench mode replays as the simulator's system of the same name in training terms
    (slime, rollflash, venus) on the bench's cluster settings, and reaches the bench's N steps."""
    prompts = tasks(QUICK, seed=0)
    shape = validate.ChatShape(prompt_tokens={p.id: 120 for p in prompts}, shared_prompt_tokens=80, obs_tokens=20,
                               stop_probability=0.05)
    rows = validate.trace_rows(QUICK, shape, prompts)
    cost = CostModel(fixed_s=0.01, token_s=1e-4, kv_token_s=1e-7, reload_token_s=0.0,
                     kv_capacity_tokens=QUICK.kv_tokens_per_engine)
    for mode in ("trajectory_level", "action_level", "venus"):
        first, last = validate.simulate_round(QUICK, cost, rows, mode, tmp_path / "trace.jsonl", trainer_s=0.5,
                                              predictor_spearman=0.7)
        assert 0 < first < last
