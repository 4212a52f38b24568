"""The `EngineClient` port: the in-process engine implements it with typed records, KV moves
between two engines through it alone, and no caller in `src/` reaches into an engine with a
closure."""

import asyncio
import re
from pathlib import Path

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.client import EngineClient
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.stats import EngineLoad, EngineStats
from venusrl.model.checkpoint import load_model
from venusrl.types import Priority, SamplingParams

GREEDY = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(-1,))
SRC = Path(__file__).resolve().parents[2] / "src" / "venusrl"


def _engine(model_dir) -> AsyncEngine:
    return AsyncEngine(Engine(load_model(model_dir), EngineConfig(kv_capacity_tokens=512, page_size=4)))


async def _generate(client: EngineClient, prompt: list[int], key: str) -> list[int]:
    final = None
    async for output in client.generate(prompt, GREEDY, Priority.HIGH, key):
        final = output
    return final.output_ids


def test_the_in_process_engine_is_an_engine_client_with_typed_records(tiny_model_dir):
    client = _engine(tiny_model_dir)

    async def scenario():
        assert isinstance(client, EngineClient)
        await client.start_trajectory("t", Priority.HIGH)
        await _generate(client, list(range(1, 30)), "t")
        client.set_priority("t", Priority.LOW)  # a notification, ordered before what follows
        load, stats, health = await client.load(), await client.stats(), await client.health()
        assert await client.demoted_trajectories() == frozenset()
        released, again = await client.release_trajectory("t"), await client.release_trajectory("t")
        return load, stats, health, released, again

    try:
        load, stats, health, released, again = asyncio.run(scenario())
    finally:
        asyncio.run(client.shutdown())
    assert isinstance(load, EngineLoad) and load.kv_capacity_tokens == 512 and load.demoted == frozenset()
    assert load.memory_stalls == sum(stats.memory_stalls.values())  # our engine counts them
    assert isinstance(stats, EngineStats) and stats.live_trajectories == 1 and stats.weight_version == 0
    assert health.alive and health.restarts == 0
    assert (released, again) == (True, False)
    dead = asyncio.run(client.health())
    assert not dead.alive and dead.error


def test_prefix_kv_moves_between_engines_through_the_client_alone(tiny_model_dir):
    source, target = _engine(tiny_model_dir), _engine(tiny_model_dir)
    prompt = list(range(1, 41))

    async def scenario():
        expected = await _generate(source, prompt, "moved")
        prefix = await source.export_prefix(prompt)
        await target.start_trajectory("moved", Priority.HIGH)
        cached = await target.import_prefix(prompt[: prefix.tokens], prefix.kv, "moved")
        before = (await target.stats()).prompt_tokens
        got = await _generate(target, prompt, "moved")
        after = await target.stats()
        return expected, prefix, cached, got, after, after.prompt_tokens - before

    try:
        expected, prefix, cached, got, after, admitted = asyncio.run(scenario())
    finally:
        for client in (source, target):
            asyncio.run(client.shutdown())
    assert prefix.tokens == prefix.kv.num_tokens == 40 and cached == 40
    assert got == expected, "the moved prefix gives the same greedy continuation"
    # the last prompt token is always computed (its logits start the reply): the page holding
    # it is the only part of the moved prefix the target prefills
    assert admitted == 40 and after.cached_tokens == 36 and after.recomputed_tokens == 0


def test_no_caller_in_src_reaches_into_an_engine_with_a_closure():
    offenders = [f"{path.relative_to(SRC)}:{number}"
                 for path in SRC.rglob("*.py")
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"\.a?call\(lambda", line)]
    assert offenders == []
