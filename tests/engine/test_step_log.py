"""The engine's step log: every step that computed something, shaped as the runner saw it
(cached prefix tokens are not work), bounded, and read by index through `EngineClient`."""

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.step_log import StepLog
from venusrl.model.tiny import make_tiny_model
from venusrl.types import SamplingParams

SAMPLING = SamplingParams(max_new_tokens=3, stop_token_ids=(-1,))


def test_steps_count_the_tokens_computed_not_the_cached_prefix(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=512, page_size=1))
    prompt = list(range(10, 50))
    before = time.monotonic()
    engine.generate([prompt], SAMPLING)
    first = engine.steps_since(0)
    engine.generate([prompt + [60]], SAMPLING)  # the 40-token prefix is cached
    again = engine.steps_since(first.next_index)
    assert first.start == 0 and again.start == first.next_index
    assert sum(s.prefill_tokens for s in first.samples) == len(prompt)
    assert sum(s.prefill_tokens for s in again.samples) <= 2
    assert sum(s.decode_seqs for s in first.samples) == sum(s.decode_seqs for s in again.samples) == 3
    steps = first.samples + again.samples
    assert all(s.seconds > 0 for s in steps)
    ends = [s.ended_s for s in steps]
    assert ends == sorted(ends) and before < ends[0] <= time.monotonic()


def test_the_log_reaches_a_caller_through_the_client(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model", layers=1)

    async def main():
        client = AsyncEngine(Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=512, page_size=1)))
        try:
            async for _ in client.generate(list(range(10, 30)), SAMPLING):
                pass
            return await client.steps_since(0)
        finally:
            await client.shutdown()

    steps = asyncio.run(main())
    assert sum(s.decode_seqs for s in steps.samples) == 3 and steps.next_index == len(steps.samples)


class _Item:
    """The two fields `batch_shape` reads of a scheduled request."""

    def __init__(self, prefill: int) -> None:
        self.token_ids = list(range(max(1, prefill)))
        self.positions = list(range(len(self.token_ids)))
        self.sample = True


@given(st.integers(1, 20), st.lists(st.integers(0, 5), max_size=80), st.data())
def test_a_bounded_log_keeps_the_newest_steps_and_their_indices(limit, prefills, data):
    log = StepLog(limit)
    for n, prefill in enumerate(prefills):
        log.record([_Item(prefill)], float(n), float(n) + 0.5)
    assert len(log.samples) <= limit
    assert log.first + len(log.samples) == len(prefills)  # every step of a decode at least
    index = data.draw(st.integers(0, len(prefills) + 3))
    part = log.since(index)
    assert part.start == max(index, log.first)
    assert [s.ended_s for s in part.samples] == [float(n) + 0.5 for n in range(part.start, len(prefills))]


def test_a_negative_index_is_refused():
    with pytest.raises(ValueError, match="index must be >= 0"):
        StepLog().since(-1)
