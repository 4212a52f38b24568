"""The engine thread: a waiting request that cannot be admitted does not make it spin on
empty steps, and the call that frees room wakes it."""

import asyncio
import time

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.checkpoint import load_model
from venusrl.types import Priority, SamplingParams


def _wait_until(runner: AsyncEngine, condition, iterations: int = 1000) -> bool:
    """Whether `condition` holds within `iterations` engine-loop iterations."""
    for _ in range(iterations):
        if condition():
            return True
        runner.wait_iterations(1, 30)
    return condition()


def test_a_request_that_cannot_be_admitted_waits_for_a_call_instead_of_spinning(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir), EngineConfig(kv_capacity_tokens=48, page_size=1))
    steps = 0
    step = engine.step

    def counted_step():
        nonlocal steps
        steps += 1
        return step()

    engine.step = counted_step
    runner = AsyncEngine(engine)

    def pin(e: Engine, delta: int) -> None:
        """Lock (or unlock) the cached 40 tokens as a running request locks its prefix: KV no
        request may evict, the one state in which a lone waiting request cannot be admitted
        (a lone request may evict every unlocked tier, `admission.Step.eviction_tier`)."""
        node = e.scheduler.cache.match_prefix(cached).node
        (e.scheduler.cache.lock if delta > 0 else e.scheduler.cache.unlock)(node)

    cached = list(range(1, 33))

    async def scenario():
        high = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(-1,))
        async for output in runner.generate(cached, high, Priority.HIGH, "high"):
            cached[32:] = output.output_ids[:-1]  # 39 of the 48-token pool cached
        await runner.acall(lambda e: pin(e, 1))
        low = SamplingParams(max_new_tokens=4, temperature=0, stop_token_ids=(-1,))
        outputs = runner.generate(list(range(100, 116)), low, Priority.LOW)
        pending = asyncio.ensure_future(anext(outputs))
        # the LOW request does not fit beside the locked KV: it waits. Once the engine has found
        # that out (one idle step), further loop iterations are waits for a call, not steps.
        assert await asyncio.to_thread(lambda: _wait_until(runner, lambda: engine.last_step_idle))
        stalled_steps = steps
        assert await asyncio.to_thread(runner.wait_iterations, 3, 30)
        assert steps == stalled_steps and not pending.done()
        await runner.acall(lambda e: pin(e, -1))
        last = await asyncio.wait_for(pending, timeout=30)
        async for output in outputs:
            last = output
        return last

    try:
        final = asyncio.run(scenario())
    finally:
        asyncio.run(runner.shutdown())
    assert final.finished and len(final.output_ids) == 4


def test_the_loop_counts_its_waits_calls_and_steps_once_each(tiny_model_dir):
    """The engine thread's time splits into waits, callers' calls and steps, disjoint: their
    sum never exceeds the wall time it ran, and the calls it ran are counted."""
    engine = Engine(load_model(tiny_model_dir), EngineConfig(kv_capacity_tokens=256, page_size=1))
    runner = AsyncEngine(engine)
    started = time.monotonic()

    async def scenario():
        for _ in range(5):
            await runner.stats()
        sampling = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(-1,))
        async for _ in runner.generate(list(range(1, 17)), sampling):
            await runner.stats()
        return await runner.stats()

    try:
        stats = asyncio.run(scenario())
    finally:
        asyncio.run(runner.shutdown())
    elapsed = time.monotonic() - started
    steps_s = sum(s.seconds for s in engine.step_log.samples)
    assert stats.calls_s > 0 and len(engine.step_log.samples) >= 6
    assert stats.idle_no_request_s + stats.idle_stalled_s + stats.calls_s + steps_s <= elapsed
