"""Weights to Ray engine actors (`engine.placement: process` on `run.runtime: ray`, a two-CPU
Ray instance on one node): with `engine.weight_sync.transport: broadcast` every engine actor
joins the rollout actor's weight group at start-up and takes a trained step's weights by a
gloo broadcast; with `auto`, engine actors on the rollout actor's node take them by shared
memory and join no group. Either way each engine then holds the trainer's weights bit for bit
(cast to the engine's dtype), at the step's version."""

import asyncio
import json
import logging

import pytest
import torch

ray = pytest.importorskip("ray")

from tests.runtime.test_ray_runtime import make_config  # noqa: E402

from venusrl.engine.remote.remote import RemoteEngine  # noqa: E402
from venusrl.model.checkpoint import resolve_dtype  # noqa: E402
from venusrl.runtime.local import prepare  # noqa: E402
from venusrl.runtime.ray_runtime import open_actors  # noqa: E402
from venusrl.weights.digest import expected_digest  # noqa: E402


async def _train_one_step_and_push(config, run_dir, train_prompts):
    async with open_actors(config, run_dir, train_prompts, None) as (rollout, trainer, handshakes):
        await rollout.start()
        for _ in range(config.coordinator.batch_groups):
            await trainer.accumulate(await rollout.next_group())
        result = await trainer.step()
        engines = [RemoteEngine.from_handshake(h) for h in handshakes]
        before = [await engine.weight_digest() for engine in engines]
        seconds = await rollout.push_weights(await trainer.weights(), result.version)
        weights = await (await trainer.weights())
        digests = [await engine.weight_digest() for engine in engines]
        versions = [(await engine.health()).weight_version for engine in engines]
    return result.version, seconds, weights, handshakes, before, digests, versions


ON_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize(("transport", "device", "route", "ranks"), [
    ("broadcast", "cpu", "broadcast", [1, 2]),
    ("auto", "cpu", "shared_memory", [None, None]),  # one node: the engine actors share the rollout actor's host
    # one GPU: one engine actor on half of it; gloo from the object store's host copy into its device parameters
    pytest.param("broadcast", "cuda", "broadcast", [1], marks=ON_GPU),
    pytest.param("auto", "cuda", "shared_memory", [None], marks=ON_GPU),
])
def test_engine_actors_take_a_trained_step_bit_identical_by_their_transport(
        ray_on_loopback, tiny_model_dir, tmp_path, caplog, transport, device, route, ranks):
    caplog.set_level(logging.INFO, logger="venusrl.runtime.ray_runtime")
    config = make_config(tiny_model_dir, steps=1, scheduler={"engines": len(ranks)}, model={"device": device},
                         rollout={"environment": "tests.runtime.hashed_reward_env:HashedRewardEnv"},  # the step moves the weights
                         engine={"placement": "process", "weight_sync": {"transport": transport}})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    train_prompts, _, _ = prepare(config, run_dir)

    version, seconds, weights, handshakes, before, digests, versions = asyncio.run(
        _train_one_step_and_push(config, run_dir, train_prompts))

    assert version == 1 and versions == [1] * len(ranks)
    assert list(seconds) == [route]
    assert [h["weight_rank"] for h in handshakes] == ranks
    tied = json.loads((tiny_model_dir / "config.json").read_text()).get("tie_word_embeddings", False)
    want = expected_digest(weights, resolve_dtype(config.model.dtype), tied)
    assert digests == [want] * len(ranks) and want not in before  # the step changed the weights; the push carried them
    joined = [r.args for r in caplog.records if r.msg.startswith("weight group: engine(s)")]
    # the rendezvous at the rollout actor's node IP as Ray reports it (other nodes reach it there)
    assert joined == ([(list(range(len(ranks))), ray.util.get_node_ip_address(), joined[0][2])] if route == "broadcast" else [])
