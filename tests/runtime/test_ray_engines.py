"""Engines as their own Ray actors (`engine.placement: process` on `run.runtime: ray`), on a
two-CPU Ray instance on loopback: two engine actors in two processes, reached over sockets,
answer like an in-process engine and move prefix KV actor to actor with nothing recomputed;
a training run places its engines in actors and trains."""

import asyncio
import logging
import os

import pytest

ray = pytest.importorskip("ray")

from tests.runtime.test_ray_runtime import actor_placement, make_config  # noqa: E402

from venusrl.config import ConfigError, validate_config  # noqa: E402
from venusrl.engine.async_engine import AsyncEngine  # noqa: E402
from venusrl.engine.config import EngineConfig  # noqa: E402
from venusrl.engine.engine import Engine  # noqa: E402
from venusrl.engine.remote.process import EngineSpec  # noqa: E402
from venusrl.engine.remote.remote import RemoteEngine  # noqa: E402
from venusrl.model.checkpoint import load_model  # noqa: E402
from venusrl.runtime.ray_runtime import (  # noqa: E402
    engine_actor_gpus,
    open_engine_actors,
    start_engine_actors,
    train,
)
from venusrl.types import Priority, SamplingParams  # noqa: E402

CONFIG = EngineConfig(kv_capacity_tokens=512, page_size=4)
GREEDY = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(-1,))
PROMPT = list(range(1, 41))


@pytest.fixture(scope="module")
def ray_on_loopback():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


async def _reply(client, key: str | None) -> list[int]:
    final = None
    async for output in client.generate(PROMPT, GREEDY, Priority.HIGH, key):
        final = output
    return final.output_ids


def test_two_engine_actors_serve_and_move_a_prefix_between_them(ray_on_loopback, tiny_model_dir):
    actors = start_engine_actors(2, gpus=0)
    in_process = AsyncEngine(Engine(load_model(tiny_model_dir), CONFIG))

    async def scenario():
        handshakes = await open_engine_actors(actors, EngineSpec(model_dir=str(tiny_model_dir), engine=CONFIG))
        source, target = (RemoteEngine.from_handshake(h) for h in handshakes)
        try:
            expected = await _reply(in_process, None)
            first = await _reply(source, "moved")
            await target.start_trajectory("moved", Priority.HIGH)
            cached = await source.send_prefix(PROMPT, target, "moved")
            moved = await _reply(target, "moved")
            return handshakes, expected, first, cached, moved, await target.stats()
        finally:
            await in_process.shutdown()
            for client in (source, target):
                await client.shutdown()

    try:
        handshakes, expected, first, cached, moved, stats = asyncio.run(scenario())
    finally:
        for actor in actors:
            ray.kill(actor)
    pids = {h["pid"] for h in handshakes}
    assert len(pids) == 2 and os.getpid() not in pids
    assert first == expected and moved == expected
    assert cached == 40
    assert stats.recomputed_tokens == 0 and stats.cached_tokens == 36 and stats.prompt_tokens == 40


def test_a_run_with_engines_in_their_own_actors_trains(ray_on_loopback, tiny_model_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="venusrl.runtime.ray_runtime")
    config = make_config(tiny_model_dir, steps=1, engine={"placement": "process"}, scheduler={"engines": 2})

    summary = train(config, tmp_path / "run", progress=False)

    assert summary["steps"] == 1 and summary["weight_version"] == 1 and summary["groups_trained"] == 2
    where = actor_placement(caplog)
    engine_pids = {e["pid"] for e in where["engines"]}
    assert len(engine_pids) == 2
    assert not engine_pids & {os.getpid(), where["rollout"]["pid"], where["trainer"]["pid"]}


def _gpu_config(device: str, engines: int, world_size: int = 1):
    return validate_config({"model": {"path": "/models/any", "device": device}, "trainer": {"world_size": world_size},
                            "engine": {"placement": "process"}, "scheduler": {"engines": engines}})


@pytest.mark.parametrize(("device", "engines", "world_size", "cluster_gpus", "expected"), [
    ("cpu", 4, 1, 0, 0),
    ("cuda", 1, 1, 1, 0.5),  # one GPU shared with a one-rank trainer
    ("cuda", 2, 1, 3, 1),
    ("cuda", 4, 2, 6, 1),
])
def test_each_engine_actor_gets_a_gpu_where_there_are_enough(device, engines, world_size, cluster_gpus, expected):
    assert engine_actor_gpus(_gpu_config(device, engines, world_size), cluster_gpus) == expected


def test_too_few_gpus_for_the_engine_actors_is_a_config_error():
    with pytest.raises(ConfigError, match=r"scheduler.engines=3 .* needs 3 GPUs .* has 2"):
        engine_actor_gpus(_gpu_config("cuda", 3), 2)
