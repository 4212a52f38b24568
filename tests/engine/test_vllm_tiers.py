"""Trajectory-aware residency and demotion on vLLM (engine/vllm/tiers.py), on the tiny Qwen3 of
test_vllm_backend and a pool of 32 blocks of 32 tokens: a HIGH trajectory's KV survives a
flood of other requests between its turns under `tiers` and not under `lru`; a LOW request
never releases a HIGH hold while other work runs; the shortest HIGH trajectory is demoted when
the HIGH holds exceed the pool, and the others keep their KV; holding leaves greedy outputs
as they are. Runs in the vLLM venv (`make test-vllm`); skipped where vLLM is not installed."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this venv: `make test-vllm` runs these tests "
                                   "in .venv-vllm (built by `make vllm-venv`)")

from tests.engine.test_vllm_backend import NO_STOP, _collect, _ours, _prompts, _tiny  # noqa: E402

from venusrl.engine.config import EngineConfig  # noqa: E402
from venusrl.engine.vllm.backend import VLLMEngine  # noqa: E402
from venusrl.model.checkpoint import load_model  # noqa: E402
from venusrl.types import Priority, SamplingParams  # noqa: E402

BLOCK = 32
POOL_TOKENS = 32 * BLOCK


def _config(cache_policy):
    return EngineConfig(kv_capacity_tokens=POOL_TOKENS, max_running_requests=4, max_prefill_tokens=2048,
                        page_size=BLOCK, cache_policy=cache_policy, demotion=True)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """A `tiers` and an `lru` vLLM engine on one model, and our model (the greedy reference)."""
    model_dir = _tiny(tmp_path_factory.mktemp("vllm-tiers") / "model", seed=0)
    runner = asyncio.Runner()

    async def start():
        return VLLMEngine.start(model_dir, _config("tiers")), VLLMEngine.start(model_dir, _config("lru"))

    tiers, lru = runner.run(start())
    try:
        yield runner, tiers, lru, load_model(model_dir)
    finally:
        runner.run(tiers.shutdown())
        runner.run(lru.shutdown())
        runner.close()


def _greedy(new_tokens):
    return SamplingParams(max_new_tokens=new_tokens, temperature=0, stop_token_ids=NO_STOP)


async def _turn(engine, prompt, new_tokens, priority, trajectory):
    """One turn, alone: its output and the prompt tokens vLLM's prefix cache served."""
    before = (await engine.stats()).cached_tokens
    out = await _collect(engine, prompt, _greedy(new_tokens), priority, trajectory_id=trajectory)
    await _settle(engine)
    return out, (await engine.stats()).cached_tokens - before


async def _settle(engine):
    """Until vLLM's stats show the engine idle (each step refreshes them; the last one comes
    just after the last output)."""
    while (stats := await engine.stats()).running or stats.waiting:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)


def _full_blocks(tokens):
    """Tokens in the full blocks of a context of `tokens` (vLLM hashes full blocks only, and
    a finished request has computed all but its last token)."""
    return (tokens - 1) // BLOCK * BLOCK


def test_a_high_trajectory_keeps_its_kv_through_a_flood_under_tiers_only(engines):
    """Between a HIGH trajectory's turns, 8 LOW requests pass through the pool (64 block
    allocations for 32 blocks). Under `tiers` its next turn finds every full block of its
    context cached; under `lru` (vLLM's own cache) the flood has taken them."""
    runner, tiers, lru, ours = engines
    prompt, flood = _prompts(1, 192, seed=20)[0], _prompts(8, 224, seed=21)

    async def run(engine):
        first, _ = await _turn(engine, prompt, 16, Priority.HIGH, "t")
        await asyncio.gather(*(_collect(engine, p, _greedy(4), Priority.LOW) for p in flood))
        await _settle(engine)
        second_prompt = prompt + first.output_ids + _prompts(1, 32, seed=22)[0]
        second, cached = await _turn(engine, second_prompt, 8, Priority.HIGH, "t")
        await engine.release_trajectory("t")
        return first, second, cached, second_prompt

    first, second, held_hit, second_prompt = runner.run(run(tiers))
    *_, lru_hit, _ = runner.run(run(lru))
    context = len(prompt) + len(first.output_ids)
    assert held_hit >= _full_blocks(context) == 192, held_hit
    assert lru_hit < _full_blocks(context), lru_hit
    assert first.output_ids == _ours(ours, [prompt], 16)[0]
    assert second.output_ids == _ours(ours, [second_prompt], 8)[0]


def test_a_low_request_releases_a_high_hold_only_when_it_is_the_only_work(engines):
    """A HIGH trajectory holds 6 blocks. A LOW request runs; a second LOW one needs 29 of the
    32 blocks: it may not release the HIGH hold while the first runs, so it waits (the hold
    intact, no HIGH-held token evicted; vLLM's admission stops at it for memory, counted as a
    LOW memory stall) and starts only after the first finished, when it is the iteration's only
    work and may release every tier (work conservation)."""
    runner, tiers, _, _ = engines
    held_prompt, running_prompt, big_prompt = _prompts(1, 192, 23)[0], _prompts(1, 320, 24)[0], _prompts(1, 900, 25)[0]

    async def run():
        await _turn(tiers, held_prompt, 8, Priority.HIGH, "h")
        start = await tiers.stats()
        log: list[str] = []

        async def low(prompt, new_tokens, name):
            async for out in tiers.generate(prompt, _greedy(new_tokens), Priority.LOW):
                if out.new_token_ids:
                    log.append(name)

        running = asyncio.create_task(low(running_prompt, 96, "running"))
        while "running" not in log:
            await asyncio.sleep(0.01)
        big = asyncio.create_task(low(big_prompt, 4, "big"))
        while (await tiers.stats()).waiting < 1:
            await asyncio.sleep(0.01)
        while_waiting = await tiers.stats()
        while_waiting_load = await tiers.load()
        await asyncio.gather(running, big)
        await _settle(tiers)
        await tiers.release_trajectory("h")
        return log, start, while_waiting, while_waiting_load, await tiers.stats()

    log, start, while_waiting, while_waiting_load, after = runner.run(run())
    assert while_waiting.kv_tokens["high_ref"] == 192
    # each iteration it waited, vLLM's admission stopped at it for want of blocks
    assert while_waiting.memory_stalls["low"] > start.memory_stalls["low"]
    assert while_waiting.memory_stalls["high"] == start.memory_stalls["high"]
    assert while_waiting_load.memory_stalls >= sum(while_waiting.memory_stalls.values())
    assert while_waiting.evicted_tokens["high_ref"] == start.evicted_tokens["high_ref"]
    assert log.index("big") > len(log) - 1 - log[::-1].index("running"), "it started before the other finished"
    assert after.evicted_tokens["high_ref"] - start.evicted_tokens["high_ref"] == 192  # once it was the only work


def test_the_shortest_high_trajectory_is_demoted_when_high_demand_exceeds_the_pool(engines):
    """Three HIGH trajectories hold 5, 10 and 13 blocks of the 32 (the 10-block one finished
    first, so LRU would evict it first). The 13-block one's next turn needs 7 more blocks:
    the HIGH demand exceeds the pool, so the shortest (5 blocks) is demoted, its hold becomes
    LOW-held and goes for the room; the others keep all their KV. It stays demoted while the
    rest fill the pool and is promoted back once a HIGH trajectory is released."""
    runner, tiers, _, _ = engines
    prompts = {"mid": _prompts(1, 320, 26)[0], "long": _prompts(1, 416, 27)[0], "short": _prompts(1, 160, 28)[0]}

    async def run():
        firsts = {}
        for key, prompt in prompts.items():  # mid first: the least recently used hold
            firsts[key], _ = await _turn(tiers, prompt, 8, Priority.HIGH, key)
        before = await tiers.stats()
        long_next = prompts["long"] + firsts["long"].output_ids + _prompts(1, 200, 29)[0]
        _, long_hit = await _turn(tiers, long_next, 8, Priority.HIGH, "long")
        demoted = await tiers.demoted_trajectories()
        mid_next = prompts["mid"] + firsts["mid"].output_ids + _prompts(1, 16, 30)[0]
        _, mid_hit = await _turn(tiers, mid_next, 8, Priority.HIGH, "mid")
        still = await tiers.demoted_trajectories()
        await tiers.release_trajectory("long")
        await _turn(tiers, _prompts(1, 40, 31)[0], 2, Priority.LOW, None)  # a step, to rebalance
        after = await tiers.stats()
        promoted = await tiers.demoted_trajectories()
        for key in ("mid", "short"):
            await tiers.release_trajectory(key)
        return before, long_hit, mid_hit, demoted, still, promoted, after

    before, long_hit, mid_hit, demoted, still, promoted, after = runner.run(run())
    assert before.kv_tokens["high_ref"] == (5 + 10 + 13) * BLOCK
    assert demoted == still == {"short"} and not promoted
    assert long_hit >= 13 * BLOCK and mid_hit >= 10 * BLOCK  # every held block
    assert after.evicted_tokens["low_ref"] - before.evicted_tokens["low_ref"] == 5 * BLOCK  # the demoted hold
    assert after.evicted_tokens["high_ref"] == before.evicted_tokens["high_ref"]
    assert after.demotions - before.demotions == 1 and after.promotions - before.promotions == 1


def test_holding_leaves_greedy_outputs_unchanged(engines):
    """Two trajectories, two turns each, the second turns served from their holds: every
    output is our engine's greedy output for its prompt."""
    runner, tiers, _, ours = engines
    prompts = _prompts(2, 96, seed=32)

    async def run():
        outputs, hits = [], []
        firsts = await asyncio.gather(*(_collect(tiers, p, _greedy(24), Priority.HIGH, trajectory_id=f"g{i}")
                                        for i, p in enumerate(prompts)))
        await _settle(tiers)
        for i, (prompt, first) in enumerate(zip(prompts, firsts, strict=True)):
            second_prompt = prompt + first.output_ids + _prompts(1, 8, seed=33 + i)[0]
            second, hit = await _turn(tiers, second_prompt, 24, Priority.HIGH, f"g{i}")
            outputs.append((prompt, first.output_ids, second_prompt, second.output_ids))
            hits.append(hit)
            await tiers.release_trajectory(f"g{i}")
        return outputs, hits

    outputs, hits = runner.run(run())
    assert all(hit >= _full_blocks(96 + 24) for hit in hits), hits
    for prompt, first, second_prompt, second in outputs:
        assert first == _ours(ours, [prompt], 24)[0]
        assert second == _ours(ours, [second_prompt], 24)[0]
