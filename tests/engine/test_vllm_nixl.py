"""A turn moved between two live vLLM engines takes its prefix KV along over NIXL
(`engine.vllm_kv_connector: nixl`, engine/vllm/nixl.py): the target's prefix cache serves the
moved blocks and the turn's greedy output equals the unmoved run's. Two engines on the tiny
head_dim-64 model serve the module. Runs in the vLLM venv with NIXL (`make test-vllm`); skipped
where vLLM or NIXL is not installed."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this venv: `make test-vllm` runs these tests "
                                   "in .venv-vllm (built by `make vllm-venv`)")

import torch  # noqa: E402

from venusrl.engine.config import EngineConfig  # noqa: E402
from venusrl.engine.vllm.backend import VLLMEngine  # noqa: E402
from venusrl.engine.vllm.connector import nixl_installed  # noqa: E402
from venusrl.model.checkpoint import load_model  # noqa: E402
from venusrl.model.tiny import make_tiny_model  # noqa: E402
from venusrl.types import Priority, SamplingParams  # noqa: E402

pytestmark = pytest.mark.skipif(not nixl_installed(), reason="NIXL is not installed in this venv: `make vllm-venv` "
                                "installs nixl-cu12==1.5.1 --no-deps")

BLOCK = 32  # vLLM's CPU KV block
NO_STOP = (-1,)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    model_dir = make_tiny_model(tmp_path_factory.mktemp("vllm-nixl") / "model", layers=4, hidden=256, heads=4,
                                kv_heads=2, head_dim=64, seed=0)
    runner = asyncio.Runner()
    config = EngineConfig(kv_capacity_tokens=4096, max_running_requests=4, page_size=BLOCK, vllm_kv_connector="nixl")

    async def start():
        return VLLMEngine.start(model_dir, config), VLLMEngine.start(model_dir, config)

    a, b = runner.run(start())
    try:
        yield runner, a, b, model_dir
    finally:
        runner.run(a.shutdown())
        runner.run(b.shutdown())
        runner.close()


def _prompt(length, seed):
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


async def _greedy(engine, prompt, tokens, trajectory_id=None):
    params = SamplingParams(max_new_tokens=tokens, temperature=0, stop_token_ids=NO_STOP)
    last = None
    async for out in engine.generate(prompt, params, Priority.HIGH, trajectory_id):
        last = out
    return last.output_ids


def test_a_moved_turn_hits_the_moved_blocks_and_matches_the_unmoved_run(engines):
    """A trajectory's first turn runs on A; its next turn moves to B. B's prefix-cache hits
    for that turn are exactly the moved blocks (B never computed these tokens), and its greedy
    output equals A's for the same context."""
    runner, a, b, model_dir = engines

    async def run():
        prompt = _prompt(100, seed=1)
        await a.start_trajectory("moved", Priority.HIGH)
        context = prompt + await _greedy(a, prompt, 20, "moved")  # 120 tokens
        await b.start_trajectory("moved", Priority.HIGH)
        moved = await a.send_prefix(context, b, "moved")
        await a.release_trajectory("moved")
        before = await b.stats()
        on_b = await _greedy(b, context, 16, "moved")
        after = await b.stats()
        unmoved = await _greedy(a, context, 16)
        return context, moved, after.cached_tokens - before.cached_tokens, after.prompt_tokens - before.prompt_tokens, \
            on_b, unmoved

    context, moved, hits, queried, on_b, unmoved = runner.run(run())
    assert moved == (len(context) - 1) // BLOCK * BLOCK == 96
    assert queried == len(context)
    assert hits == moved
    assert on_b == unmoved


def test_weights_update_after_a_move(engines):
    """A weight update right after a move clears both prefix caches (the source's exported
    blocks are freed once read, not held past the update) and both engines serve on."""
    runner, a, b, model_dir = engines

    async def run():
        context = _prompt(70, seed=2)
        moved = await a.send_prefix(context, b, None)
        state = load_model(model_dir).state_dict()
        version = (await a.health()).weight_version + 1
        await asyncio.gather(a.update_weights(state, version), b.update_weights(state, version))
        return moved, await a.health(), await b.health(), await _greedy(b, context, 4)

    moved, health_a, health_b, out = runner.run(run())
    assert moved == 64
    assert health_a.alive and health_b.alive and health_a.weight_version == health_b.weight_version
    assert len(out) == 4


def test_a_context_within_one_block_moves_nothing(engines, caplog):
    runner, a, b, model_dir = engines
    with caplog.at_level("INFO", logger="venusrl.engine.vllm.nixl"):
        moved = runner.run(a.send_prefix(_prompt(BLOCK, seed=3), b, "short"))
    assert moved == 0
    assert "fills no whole KV block" in caplog.text
