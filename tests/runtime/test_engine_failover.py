"""`EngineFailover` over two in-process engines: a turn whose engine stops mid-stream resumes
on the other from its delivered tokens, one stream to the caller with the tokens, log-probs
and versions of an uninterrupted turn; later calls go to the survivor; with no engine left,
calls raise `AllEnginesLost`."""

import asyncio
import itertools

import pytest

from venusrl.engine.async_engine import AsyncEngine, EngineStopped
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.remote.process import EngineSpec
from venusrl.engine.remote.remote import spawn_engines
from venusrl.model.checkpoint import load_model
from venusrl.runtime.engine_failover import AllEnginesLost, EngineFailover
from venusrl.types import Priority, SamplingParams

CONFIG = EngineConfig(kv_capacity_tokens=512, page_size=4)
GREEDY = SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(-1,))
PROMPT = list(range(1, 41))


async def _final(stream):
    final = None
    async for output in stream:
        final = output
    return final


def _engines(model_dir, count):
    return [AsyncEngine(Engine(load_model(model_dir), CONFIG)) for _ in range(count)]


def test_a_turn_cut_by_its_engines_loss_resumes_on_the_other_with_its_tokens(tiny_model_dir):
    async def scenario():
        engines = _engines(tiny_model_dir, 2)
        try:
            reference = await _final(engines[1].generate(PROMPT, GREEDY, Priority.HIGH, "reference"))
            failover = EngineFailover(engines)
            client = failover.clients[0]
            seen, cut_after = [], None
            async for output in client.generate(PROMPT, GREEDY, Priority.HIGH, "cut"):
                seen.append(output)
                if cut_after is None and len(output.output_ids) >= 4:
                    cut_after = len(output.output_ids)
                    await engines[0].shutdown()  # the engine thread ends: its stream fails with EngineStopped
            after = await _final(client.generate(PROMPT, GREEDY, Priority.HIGH, "after"))
            return reference, seen, cut_after, failover, after
        finally:
            await engines[1].shutdown()

    reference, seen, cut_after, failover, after = asyncio.run(scenario())
    final = seen[-1]
    assert final.finished and final.output_ids == reference.output_ids
    assert final.logprobs == pytest.approx(reference.logprobs, abs=1e-4)
    assert final.weight_versions == reference.weight_versions
    # one stream: each output extends the last, nothing delivered twice
    for earlier, later in itertools.pairwise(seen):
        assert later.output_ids[:len(earlier.output_ids)] == earlier.output_ids
    assert failover.live() == [1] and failover.serving == [1, 1]
    assert failover.stats()["engines_lost"] == 1 and failover.stats()["turns_resumed"] == 1
    # the survivor re-reads the prompt and what was delivered before the loss (at least the
    # tokens seen at the cut; the stopping engine may hand over one more step)
    assert cut_after <= failover.stats()["tokens_recomputed"] - len(PROMPT) < len(final.output_ids)
    assert after.output_ids == reference.output_ids  # served by the survivor


def test_with_every_engine_lost_a_call_raises(tiny_model_dir):
    async def scenario():
        engines = _engines(tiny_model_dir, 1)
        await engines[0].shutdown()
        failover = EngineFailover(engines)
        with pytest.raises(AllEnginesLost, match="every engine is lost"):
            await _final(failover.clients[0].generate(PROMPT, GREEDY, Priority.HIGH, "t"))
        return failover

    assert asyncio.run(scenario()).all_lost.is_set()


def test_a_disconnected_engine_process_fails_its_stream_and_answers_a_ping_anew(tiny_model_dir):
    """What the watchdog relies on: `disconnect` fails a waiting stream at once with
    EngineStopped (a cut link would leave it hanging), and `ping` reconnects and is answered
    by the process."""
    (engine,) = spawn_engines([EngineSpec(model_dir=str(tiny_model_dir), engine=CONFIG)])

    async def scenario():
        stream = engine.generate(PROMPT, SamplingParams(max_new_tokens=200, temperature=0, stop_token_ids=(-1,)),
                                 Priority.HIGH, "t")
        first = await anext(stream)
        engine.disconnect("test")
        with pytest.raises(EngineStopped, match="disconnected: test"):
            async for _ in stream:
                pass
        return first, await engine.ping()

    try:
        first, pinged = asyncio.run(scenario())
    finally:
        asyncio.run(engine.shutdown())
    assert not first.finished and pinged is True


def test_a_lost_engines_replacement_waits_for_room_then_serves_its_client_once_admitted(tiny_model_dir):
    async def scenario():
        engines = _engines(tiny_model_dir, 2)
        room = asyncio.Event()  # the cluster has room for a new engine (the lost node is back)
        asked = []

        async def replace(index):
            asked.append(index)
            await room.wait()
            return _engines(tiny_model_dir, 1)[0]

        failover = EngineFailover(engines, replace=replace)
        lost = engines[0]
        await lost.shutdown()
        await _final(failover.clients[0].generate(PROMPT, GREEDY, Priority.HIGH, "t"))  # finds it lost
        await asyncio.sleep(0)  # the replacement task asks (an event-loop turn, not a wait for time)
        before = (dict(failover.pending), list(failover.serving))
        room.set()
        while not failover.pending:
            await asyncio.sleep(0.01)  # polling for the condition
        failover.admit(0)
        served = await _final(failover.clients[0].generate(PROMPT, GREEDY, Priority.HIGH, "after"))
        stats = await engines[0].stats()
        for engine in engines:
            await engine.shutdown()
        return asked, before, failover, lost, served, stats

    asked, before, failover, lost, served, stats = asyncio.run(scenario())
    assert asked == [0] and before == ({}, [1, 1])  # asked at once, nothing pending until there is room
    assert failover.engines[0] is not lost and failover.serving == [0, 1] and failover.live() == [0, 1]
    assert served.finished and stats.prompt_tokens >= len(PROMPT)  # the replacement served client 0's turn
    assert failover.stats()["engines_lost"] == 1 and failover.stats()["engines_replaced"] == 1
