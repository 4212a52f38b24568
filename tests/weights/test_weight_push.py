"""Each weight transport delivers the trainer's weights bit for bit (cast to the engine's
dtype) with their version, into real engines: in this process (device copy), an engine
process over shared memory, and engine processes in a gloo group by broadcast. A bad push
(a tensor of the wrong shape, dtype or name; a stale segment) is refused naming what is
wrong, and the engine keeps serving the version it had, whole; the next good push brings it
up to date (one version per push, never mixed weights)."""

import asyncio
import itertools

import pytest
import torch

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.remote.process import EngineSpec
from venusrl.engine.remote.remote import spawn_engines
from venusrl.model.checkpoint import load_model
from venusrl.types import Priority, SamplingParams
from venusrl.weights.broadcast import WeightGroup
from venusrl.weights.config import WeightSyncConfig
from venusrl.weights.digest import expected_digest
from venusrl.weights.layout import WeightLayout
from venusrl.weights.pusher import WeightPusher

CONFIG = EngineConfig(kv_capacity_tokens=512, page_size=4)
GREEDY = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(-1,))
VERSIONS = itertools.count(1)


def trainer_weights(model_dir, seed: int) -> dict[str, torch.Tensor]:
    """An fp32 'trainer' state dict, moved off the checkpoint so a push is visible."""
    model = load_model(model_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


@pytest.fixture(scope="module")
def engine_processes(tiny_model_dir):
    """Two bf16 engine processes on this host, both in a gloo weight group with this process
    as rank 0."""
    group = WeightGroup.open_source("127.0.0.1", 0, 2, "gloo", 120.0)
    spec = EngineSpec(model_dir=str(tiny_model_dir), engine=CONFIG, dtype="bfloat16")
    engines = spawn_engines([spec.model_copy(update={"weight_group": group.member(rank)}) for rank in (1, 2)])
    yield engines, group
    for engine in engines:
        asyncio.run(engine.shutdown())
    assert [engine.process.returncode for engine in engines] == [0, 0]


async def _greedy(engine, prompt):
    return [o async for o in engine.generate(prompt, GREEDY, Priority.HIGH)][-1]


def test_an_engine_in_this_process_gets_the_trainers_tensors_by_a_device_copy(tiny_model_dir):
    engine = AsyncEngine(Engine(load_model(tiny_model_dir, "bfloat16"), CONFIG))
    pusher = WeightPusher([engine], WeightSyncConfig(), torch.bfloat16)
    weights = trainer_weights(tiny_model_dir, seed=1)
    tied = engine.engine.runner.model.args.tie_word_embeddings

    async def scenario():
        try:
            assert pusher.routes(weights_on_gpu=False) == {"device_copy": [0]}
            await pusher.push(weights, 3)
            digest = await engine.weight_digest()
            return digest, await engine.health(), await _greedy(engine, list(range(5, 25)))
        finally:
            await engine.shutdown()

    digest, health, output = asyncio.run(scenario())
    assert digest == expected_digest(weights, torch.bfloat16, tied)
    assert health.weight_version == 3 and output.weight_versions == [3] * GREEDY.max_new_tokens


def test_shared_memory_and_broadcast_deliver_bit_identical_weights_and_the_version(engine_processes, tiny_model_dir):
    engines, group = engine_processes
    tied = load_model(tiny_model_dir).args.tie_word_embeddings
    shared = WeightPusher(engines, WeightSyncConfig(), torch.bfloat16)
    broadcast = WeightPusher(engines, WeightSyncConfig(transport="broadcast"), torch.bfloat16, group)
    assert shared.routes(weights_on_gpu=False) == {"shared_memory": [0, 1]}
    assert broadcast.routes(weights_on_gpu=False) == {"broadcast": [0, 1]}

    async def scenario():
        seen = []
        for pusher, seed in ((shared, 2), (broadcast, 3), (shared, 4)):  # the segment is reused across pushes
            weights, version = trainer_weights(tiny_model_dir, seed), next(VERSIONS)
            seconds = await pusher.push(weights, version)
            digests = [await engine.weight_digest() for engine in engines]
            versions = [(await engine.health()).weight_version for engine in engines]
            outputs = [await _greedy(engine, list(range(5, 25))) for engine in engines]
            seen.append((expected_digest(weights, torch.bfloat16, tied), digests, versions, version, outputs, seconds))
        return seen

    try:
        for want, digests, versions, version, outputs, seconds in asyncio.run(scenario()):
            assert digests == [want, want]
            assert versions == [version, version]
            assert all(o.weight_versions == [version] * GREEDY.max_new_tokens for o in outputs)
            assert list(seconds) in (["shared_memory"], ["broadcast"])
    finally:
        shared.close()


@pytest.mark.parametrize("transport", ["shared_memory", "broadcast"])
@pytest.mark.parametrize(("breaking", "message"), [
    (lambda w: w.__setitem__("model.norm.weight", torch.ones(3)), "model.norm.weight has shape"),
    (lambda w: w.__setitem__("model.norm.weight", w["model.norm.weight"].long()), "model.norm.weight has dtype"),
    (lambda w: w.__setitem__("model.layers.0.mlp.gate.weight", torch.ones(2)), "unknown \\['model.layers.0.mlp.gate"),
    (lambda w: w.pop("model.layers.1.self_attn.q_proj.weight"), "missing \\['model.layers.1.self_attn.q_proj"),
])
def test_a_bad_push_is_refused_naming_the_tensor_and_the_engines_serve_the_old_version(
        engine_processes, tiny_model_dir, transport, breaking, message):
    engines, group = engine_processes
    pusher = WeightPusher(engines, WeightSyncConfig(transport=transport), torch.bfloat16, group)
    good, bad = trainer_weights(tiny_model_dir, 5), trainer_weights(tiny_model_dir, 6)
    breaking(bad)

    async def scenario():
        await pusher.push(good, good_version := next(VERSIONS))
        before = [await engine.weight_digest() for engine in engines]
        answers = [await _greedy(engine, list(range(7, 27))) for engine in engines]
        with pytest.raises(ValueError, match=message):
            await pusher.push(bad, next(VERSIONS))
        after = [await engine.weight_digest() for engine in engines]
        healths = [await engine.health() for engine in engines]
        again = [await _greedy(engine, list(range(7, 27))) for engine in engines]
        assert after == before and [h.weight_version for h in healths] == [good_version] * 2
        assert [a.output_ids for a in again] == [a.output_ids for a in answers]
        assert all(a.weight_versions == [good_version] * GREEDY.max_new_tokens for a in again)
        catch_up = trainer_weights(tiny_model_dir, 7)  # the next push carries every tensor
        await pusher.push(catch_up, version := next(VERSIONS))
        assert [(await e.health()).weight_version for e in engines] == [version] * 2
        return [await engine.weight_digest() for engine in engines], catch_up

    try:
        digests, catch_up = asyncio.run(scenario())
    finally:
        pusher.close()
    assert digests == [expected_digest(catch_up, torch.bfloat16, True)] * 2


def test_a_segment_that_does_not_hold_the_announced_version_whole_is_refused(engine_processes, tiny_model_dir):
    engines, _ = engine_processes
    pusher = WeightPusher(engines, WeightSyncConfig(), torch.bfloat16)
    weights = trainer_weights(tiny_model_dir, 8)

    async def scenario():
        await pusher.push(weights, version := next(VERSIONS))
        before = await engines[0].weight_digest()
        layout = WeightLayout.of(weights, torch.bfloat16)
        fields = {"path": str(pusher._shared.path), "size": pusher._shared.buffer.numel()}
        with pytest.raises(ValueError, match=f"holds versions {version}..{version}, not version {version + 1} whole"):
            await engines[0].update_weights_by("shared", version + 1, layout, fields)  # a stale announcement
        pusher._shared.buffer[:8].view(torch.int64)[0] = version + 1  # a writer died inside the next write
        with pytest.raises(ValueError, match="torn or stale"):
            await engines[0].update_weights_by("shared", version + 1, layout, fields)
        with pytest.raises(ValueError, match="is not a venusrl-weights-"):
            await engines[0].update_weights_by("shared", version + 1, layout, {**fields, "path": "/etc/passwd"})
        return before, await engines[0].weight_digest(), (await engines[0].health()).weight_version, version

    try:
        before, after, health_version, version = asyncio.run(scenario())
    finally:
        pusher.close()
    assert after == before and health_version == version


def test_a_gloo_member_binds_the_address_its_spec_names():
    """`device_host` (a Ray actor's node IP) is where gloo's transport binds: an address that is
    not this host's fails the join, reported by the first broadcast, instead of binding what
    the hostname resolves to."""
    group = WeightGroup.open_source("127.0.0.1", 0, 1, "gloo", timeout_s=30, device_host="203.0.113.7")
    assert group.member(1).device_host is None  # each member sets its own
    with pytest.raises(RuntimeError, match=r"rank 0 could not join: .*203\.0\.113\.7"):
        group.send(torch.zeros(4, dtype=torch.uint8))
