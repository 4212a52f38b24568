from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.sim.workload import (
    Workload,
    WorkloadConfig,
    coarsened,
    load_workload,
)
from venusrl.trace import read_trace


@settings(max_examples=30, deadline=None)
@given(prompt=st.integers(0, 10_000), index=st.integers(0, 7), seed=st.integers(0, 5),
       cap=st.integers(2000, 131072), max_turns=st.integers(1, 300))
def test_plans_respect_the_limits_and_are_deterministic(prompt, index, seed, cap, max_turns):
    workload = Workload(WorkloadConfig(max_total_tokens=cap, max_turns=max_turns, prompt_tokens_median=500), seed)
    plan = workload.plan(prompt, index, 0)
    assert plan == workload.plan(prompt, index, 0)
    assert 1 <= len(plan.turns) <= max_turns
    assert all(t.gen_tokens >= 1 for t in plan.turns)
    assert plan.turns[-1].obs_tokens == 0 and plan.turns[-1].tool_seconds == 0
    total = plan.prompt_tokens + sum(t.gen_tokens + t.obs_tokens for t in plan.turns)
    assert total <= max(cap, plan.prompt_tokens + 1)
    assert workload.plan(prompt, 0, 0).prompt_tokens == plan.prompt_tokens  # the group shares its prompt


def test_harder_prompts_take_longer_on_average():
    workload = Workload(WorkloadConfig(), seed=0)
    by_difficulty = sorted((workload.difficulty(p), workload.plan(p, 0, 0).gen_tokens) for p in range(400))
    easy = sum(n for _, n in by_difficulty[:100]) / 100
    hard = sum(n for _, n in by_difficulty[-100:]) / 100
    assert hard > 2 * easy


def test_coarsening_keeps_tokens_and_tool_time_and_cuts_turns():
    config = WorkloadConfig()
    coarse = coarsened(config, 4)
    assert coarse.turns_median_hard * 4 == config.turns_median_hard
    assert coarse.gen_tokens_median_hard == 4 * config.gen_tokens_median_hard
    assert coarse.tool_seconds_median == 4 * config.tool_seconds_median


def test_a_trace_is_replayed_turn_by_turn(tmp_path):
    rows = [
        {"prompt": "a", "index": 0, "turn": 1, "prompt_tokens": 50, "gen_tokens": 7, "obs_tokens": 3, "tool_seconds": 0.5},
        {"prompt": "a", "index": 0, "turn": 0, "prompt_tokens": 50, "gen_tokens": 5, "obs_tokens": 2, "tool_seconds": 0.1},
        {"prompt": "a", "index": 1, "turn": 0, "prompt_tokens": 50, "gen_tokens": 9},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    groups = read_trace(path)
    assert [t.gen_tokens for t in groups[0][0].turns] == [5, 7]
    assert groups[0][0].turns[-1].tool_seconds == 0.5  # a final tool call keeps its time
    workload = Workload(WorkloadConfig(trace=str(path)))
    assert workload.group_size == 2 and workload.plan(3, 1, 0).gen_tokens == 9


def test_the_example_workload_file_loads():
    from pathlib import Path

    config = load_workload(Path(__file__).parents[2] / "examples/sim/swe_agent.yaml")
    assert config.max_turns == 300 and config.max_total_tokens == 131072 and config.group_size == 8


@settings(max_examples=30, deadline=None)
@given(prompt=st.integers(0, 10_000), shared=st.integers(0, 10_000))
def test_the_shared_prompt_prefix_is_part_of_the_prompt(prompt, shared):
    plan = Workload(WorkloadConfig(prompt_tokens_median=500, shared_prompt_tokens=shared), 0).plan(prompt, 0, 0)
    assert plan.shared_prompt_tokens == min(shared, plan.prompt_tokens)
