"""Generation functions the agent loop calls, over the engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from venusrl.engine.async_engine import EngineStopped
from venusrl.engine.client import EngineClient
from venusrl.engine.engine import RequestOutput
from venusrl.rollout.agent_loop import GenerateFn
from venusrl.types import Priority, SamplingParams

log = logging.getLogger(__name__)


def engine_generate(engine: EngineClient, priority_of: Callable[[str], Priority | None] = lambda _: None) -> GenerateFn:
    """One turn on an engine (in this process or not), at the trajectory's current priority."""

    async def generate(prompt_ids: list[int], sampling: SamplingParams, trajectory_id: str) -> RequestOutput:
        final = None
        async for output in engine.generate(prompt_ids, sampling, priority_of(trajectory_id), trajectory_id):
            final = output
        return final

    return generate


async def release_quietly(engine: EngineClient, trajectory_id: str) -> None:
    """Release a trajectory's references on its engine; an engine that has stopped (the fault
    being handled, or the run's end) holds none any more."""
    try:
        await asyncio.shield(engine.release_trajectory(trajectory_id))
    except EngineStopped as err:
        log.info("trajectory %s: release skipped, engine stopped (%s)", trajectory_id, err)
