"""The agent loop on the real engine with a model that really calls a tool, and on scripted
model outputs for the bad inputs a model produces."""

import asyncio
import json

import pytest
from tests.engine.tool_model import ADD_TOOL, TOOL_PROMPT, TOOL_REPLY
from tests.rollout.scripted import Scripted

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.env.base import Environment, Episode, StepResult
from venusrl.model.chat import load_tokenizer
from venusrl.rollout.agent_loop import run_agent_loop
from venusrl.rollout.config import RolloutConfig
from venusrl.rollout.generate import engine_generate


class AddEnv(Environment):
    """Answers `add` calls; a `delay` makes the tool slow, `fail` makes it raise."""

    required_fields = ("a", "b")

    def __init__(self, delay: float = 0.0, fail: bool = False):
        self.delay, self.fail, self.calls = delay, fail, []

    async def reset(self, row, sandbox=None):
        self.check_row(row)
        return [dict(m) for m in TOOL_PROMPT], [ADD_TOOL]

    async def step(self, tool_calls):
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("sandbox crashed")
        self.calls.extend(tool_calls)
        return StepResult([{"role": "tool", "tool_call_id": c["id"],
                            "content": str(sum(json.loads(c["function"]["arguments"]).values()))} for c in tool_calls])

    def reward(self, episode: Episode) -> float:
        return float(any(m["role"] == "tool" and m["content"] == "5" for m in episode.messages))


def run(coro):
    return asyncio.run(coro)


def test_real_model_calls_the_tool_and_the_trajectory_is_recorded(tool_calling_model_dir):
    engine = Engine.from_pretrained(tool_calling_model_dir, EngineConfig(kv_capacity_tokens=8192, page_size=4))
    config = RolloutConfig(max_turns=2, max_new_tokens_per_turn=80, temperature=0)
    env = AddEnv()

    async def main():
        async_engine = AsyncEngine(engine)
        try:
            return await run_agent_loop(env, {"a": 2, "b": 3}, engine_generate(async_engine), engine.tokenizer,
                                        config, "traj-0")
        finally:
            await async_engine.shutdown()

    rollout = run(main())
    assert [json.loads(c["function"]["arguments"]) for c in env.calls[:1]] == [{"a": 2, "b": 3}]
    assert rollout.reward == 1.0
    assert len(rollout.token_ids) == len(rollout.generated_mask) == len(rollout.logprobs)
    generated = [t for t, m in zip(rollout.token_ids, rollout.generated_mask, strict=True) if m]
    assert engine.tokenizer.decode(generated).startswith(TOOL_REPLY + "<|im_end|>")
    assert all(lp < 0 for lp, m in zip(rollout.logprobs, rollout.generated_mask, strict=True) if m)
    assert all(lp == 0 for lp, m in zip(rollout.logprobs, rollout.generated_mask, strict=True) if not m)
    assert rollout.turns[0].weight_versions == (0,) and rollout.turns[0].tool_calls == 1
    assert engine.stats()["cached_tokens"] > 0, "the second turn reuses the first turn's KV"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def test_malformed_call_becomes_an_observation_and_the_loop_goes_on(tokenizer):
    model = Scripted(tokenizer, [('<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>', True),
                                 (TOOL_REPLY, True), ("Answer: 5", True)])
    rollout = run(run_agent_loop(AddEnv(), {"a": 2, "b": 3}, model, tokenizer, RolloutConfig(), "t"))
    assert rollout.finish_reason == "done" and rollout.reward == 1.0
    assert rollout.turns[0].tool_errors == 1 and rollout.turns[1].tool_calls == 1
    assert rollout.messages[2]["role"] == "user" and "missing required argument(s) 'b'" in rollout.messages[2]["content"]


def test_tool_timeout_is_an_observation(tokenizer):
    model = Scripted(tokenizer, [(TOOL_REPLY, True), ("gave up", True)])
    env = AddEnv(delay=5.0)
    rollout = run(run_agent_loop(env, {"a": 2, "b": 3}, model, tokenizer, RolloutConfig(tool_timeout_s=0.2), "t"))
    assert rollout.turns[0].tool_errors == 1
    assert any("timed out after 0.2s" in (m.get("content") or "") for m in rollout.messages)
    assert rollout.finish_reason == "done"


def test_crashing_tool_is_an_observation(tokenizer):
    model = Scripted(tokenizer, [(TOOL_REPLY, True), ("done", True)])
    rollout = run(run_agent_loop(AddEnv(fail=True), {"a": 2, "b": 3}, model, tokenizer, RolloutConfig(), "t"))
    assert any("RuntimeError: sandbox crashed" in (m.get("content") or "") for m in rollout.messages)


def test_truncation_is_marked(tokenizer):
    model = Scripted(tokenizer, [("x" * 500, False)])
    rollout = run(run_agent_loop(AddEnv(), {"a": 2, "b": 3}, model, tokenizer,
                                 RolloutConfig(max_total_tokens=600), "t"))
    assert rollout.finish_reason == "max_total_tokens" and rollout.truncated
    model = Scripted(tokenizer, [(TOOL_REPLY, True)] * 3)
    rollout = run(run_agent_loop(AddEnv(), {"a": 2, "b": 3}, model, tokenizer, RolloutConfig(max_turns=3), "t"))
    assert rollout.finish_reason == "max_turns" and len(rollout.turns) == 3


def test_dataset_row_missing_a_field_is_named(tokenizer):
    with pytest.raises(ValueError, match="row: missing field\\(s\\) b needed by AddEnv"):
        run(run_agent_loop(AddEnv(), {"a": 2}, Scripted(tokenizer, []), tokenizer, RolloutConfig(), "t"))


def test_qwen3_template_model_thinks_calls_and_the_trajectory_keeps_it(qwen3_tool_model_dir):
    """On the official Qwen3 template: the model's reasoning is kept in the trajectory (ids and
    reasoning_content), its call runs, and the ids are the template's rendering of the
    conversation up to the next generation prompt."""
    from tests.engine.tool_model import SPLIT_EMOJI, THINKING_REPLY

    engine = Engine.from_pretrained(qwen3_tool_model_dir, EngineConfig(kv_capacity_tokens=8192, page_size=4))
    tok = engine.tokenizer
    env = AddEnv()

    async def main():
        async_engine = AsyncEngine(engine)
        try:
            return await run_agent_loop(env, {"a": 2, "b": 3}, engine_generate(async_engine), tok,
                                        RolloutConfig(max_turns=2, max_new_tokens_per_turn=40, temperature=0), "q3")
        finally:
            await async_engine.shutdown()

    rollout = run(main())
    assert [json.loads(c["function"]["arguments"]) for c in env.calls] == [{"a": 2, "b": 3}]
    assistant = rollout.messages[1]
    assert assistant["reasoning_content"] == f"Add them {SPLIT_EMOJI}." and assistant["content"] == ""
    prompt = tok.encode_chat(TOOL_PROMPT, [ADD_TOOL])
    first_turn = tok.encode(THINKING_REPLY) + [tok.eos_token_ids[0]]
    assert rollout.token_ids[: len(prompt) + len(first_turn)] == prompt + first_turn
    second_prompt = tok.encode(tok.render(rollout.messages[:3], [ADD_TOOL], add_generation_prompt=True))
    assert rollout.token_ids[: len(second_prompt)] == second_prompt
    assert sum(rollout.generated_mask) == sum(t.generated_tokens for t in rollout.turns)
    assert len(rollout.logprobs) == len(rollout.token_ids)
    assert all(lp == 0.0 for lp, m in zip(rollout.logprobs, rollout.generated_mask, strict=True) if not m)
