"""Generation functions the agent loop calls, over the engine."""

from __future__ import annotations

from collections.abc import Callable

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.engine import RequestOutput
from venusrl.rollout.agent_loop import GenerateFn
from venusrl.types import Priority, SamplingParams


def engine_generate(engine: AsyncEngine, priority_of: Callable[[str], Priority | None] = lambda _: None) -> GenerateFn:
    """One turn on an in-process engine, at the trajectory's current priority."""

    async def generate(prompt_ids: list[int], sampling: SamplingParams, trajectory_id: str) -> RequestOutput:
        final = None
        async for output in engine.generate(prompt_ids, sampling, priority_of(trajectory_id), trajectory_id):
            final = output
        return final

    return generate
