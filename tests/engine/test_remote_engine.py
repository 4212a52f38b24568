"""The engine in its own OS process behind `RemoteEngine`: the same greedy output and typed
records as in process, prefix KV moved process to process over TCP with nothing recomputed,
a killed process seen as `EngineStopped`, and bad frames refused without hurting the engine."""

import asyncio
import os
import signal
import struct
import time

import pytest

from venusrl.engine.async_engine import AsyncEngine, EngineStopped
from venusrl.engine.client import EngineClient, EngineInfo
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.remote.process import EngineSpec
from venusrl.engine.remote.remote import RemoteEngine, spawn_engines
from venusrl.engine.remote.wire import encode_bytes, read_frame
from venusrl.engine.stats import EngineLoad, EngineStats
from venusrl.model.checkpoint import load_model
from venusrl.types import Priority, SamplingParams

CONFIG = EngineConfig(kv_capacity_tokens=512, page_size=4)
GREEDY = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(-1,))
PROMPT = list(range(1, 41))


@pytest.fixture(scope="module")
def two_engines(tiny_model_dir):
    engines = spawn_engines([EngineSpec(model_dir=str(tiny_model_dir), engine=CONFIG)] * 2)
    yield engines
    for engine in engines:
        asyncio.run(engine.shutdown())
    assert [engine.process.returncode for engine in engines] == [0, 0]


async def _generate(client: EngineClient, prompt: list[int], key: str | None, sampling=GREEDY) -> list:
    return [output async for output in client.generate(prompt, sampling, Priority.HIGH, key)]


def _in_process_reply(model_dir, prompt: list[int]) -> list[int]:
    engine = AsyncEngine(Engine(load_model(model_dir), CONFIG))

    async def scenario():
        try:
            return (await _generate(engine, prompt, None))[-1].output_ids
        finally:
            await engine.shutdown()

    return asyncio.run(scenario())


def test_the_remote_engine_answers_like_the_in_process_one(two_engines, tiny_model_dir):
    remote = two_engines[0]
    prompt = list(range(3, 33))

    async def scenario():
        assert isinstance(remote, EngineClient)
        await remote.start_trajectory("r", Priority.HIGH)
        outputs = await _generate(remote, prompt, "r")
        remote.set_priority("r", Priority.LOW)  # a notification, ordered before what follows
        load, stats, health = await remote.load(), await remote.stats(), await remote.health()
        demoted = await remote.demoted_trajectories()
        released, again = await remote.release_trajectory("r"), await remote.release_trajectory("r")
        steps = await remote.steps_since(0)
        return outputs, load, stats, health, demoted, released, again, steps

    outputs, load, stats, health, demoted, released, again, steps = asyncio.run(scenario())
    final = outputs[-1]
    assert final.finished and final.finish_reason == "length" and final.prompt_len == len(prompt)
    assert final.output_ids == _in_process_reply(tiny_model_dir, prompt)
    assert [t for o in outputs for t in o.new_token_ids] == final.output_ids, "chunks add up to the output"
    assert len(final.logprobs) == len(final.weight_versions) == GREEDY.max_new_tokens
    assert isinstance(load, EngineLoad) and load.kv_capacity_tokens == 512 and demoted == frozenset()
    assert load.memory_stalls == sum(stats.memory_stalls.values())  # counted, and carried over the wire
    assert isinstance(stats, EngineStats) and stats.live_trajectories >= 1
    assert health.alive and health.weight_version == 0
    assert (released, again) == (True, False)
    assert sum(s.decode_seqs for s in steps.samples) >= GREEDY.max_new_tokens  # the module's engine ran others too
    assert all(0 < s.ended_s <= time.monotonic() for s in steps.samples), "the engine's clock is this host's"
    info = remote.info()
    assert info.kv_capacity_tokens == 512 and info.page_size == 4 and info.vocab_size > max(prompt)


def test_a_prefix_moves_process_to_process_over_tcp_with_nothing_recomputed(two_engines):
    source, target = two_engines

    async def scenario():
        expected = (await _generate(source, PROMPT, "moved"))[-1].output_ids
        await target.start_trajectory("moved", Priority.HIGH)
        before = await target.stats()
        cached = await source.send_prefix(PROMPT, target, "moved")
        got = (await _generate(target, PROMPT, "moved"))[-1].output_ids
        after = await target.stats()
        for engine in (source, target):
            await engine.release_trajectory("moved")
        return expected, cached, got, before, after

    expected, cached, got, before, after = asyncio.run(scenario())
    assert target.kv_address is not None and target.kv_address != source.kv_address
    assert cached == 40
    assert got == expected, "the moved prefix gives the same greedy continuation"
    # the last prompt token is always computed (its logits start the reply): the page holding
    # it is the only part of the moved prefix the target prefills
    assert after.prompt_tokens - before.prompt_tokens == 40
    assert after.cached_tokens - before.cached_tokens == 36
    assert after.recomputed_tokens == before.recomputed_tokens == 0


def test_outputs_ready_together_reach_a_busy_consumer_as_one_chunk(two_engines):
    remote = two_engines[0]
    long = SamplingParams(max_new_tokens=20, temperature=0, stop_token_ids=(-1,))

    async def scenario():
        stream = remote.generate(list(range(5, 25)), long, Priority.HIGH, None)
        first = await anext(stream)
        # meanwhile another request of the same length runs to its end: it started later, so
        # every output of the first stream has arrived by then, unread
        other = await _generate(remote, list(range(30, 50)), None, long)
        rest = [output async for output in stream]
        return first, rest, other

    first, rest, other = asyncio.run(scenario())
    assert len(first.new_token_ids) >= 1 and other[-1].finished
    assert len(rest) == 1 and rest[0].finished, "everything that was ready is one output"
    assert first.new_token_ids + rest[0].new_token_ids == rest[0].output_ids and len(rest[0].output_ids) == 20


def test_calls_made_in_one_turn_of_the_loop_go_out_in_one_write_in_order(two_engines):
    """A burst of notifications (a policy change re-prioritising a group) and the call after
    it are written to the socket together as the loop's turn ends, in the order they were
    made, and the engine applies every one of them (at its next iteration): the trajectories'
    KV leaves the HIGH tier for the LOW one."""
    remote = two_engines[1]
    keys = [f"burst-{i}" for i in range(4)]

    async def scenario():
        for i, key in enumerate(keys):
            await remote.start_trajectory(key, Priority.HIGH)
            await _generate(remote, list(range(60 + 10 * i, 76 + 10 * i)), key)
        before = await remote.stats()
        transport = remote._conn().writer.transport
        writes = []
        write = transport.write
        transport.write = lambda data: (writes.append(bytes(data)), write(data))[-1]
        try:
            for key in keys:
                remote.set_priority(key, Priority.LOW)
            await remote.stats()
        finally:
            del transport.write
        await _generate(remote, list(range(100, 110)), None)  # an iteration applies the notifications
        after = await remote.stats()
        for key in keys:
            await remote.release_trajectory(key)
        return before, after, writes

    async def ops(data: bytes) -> list[str]:
        reader, ops = asyncio.StreamReader(), []
        reader.feed_data(data)
        reader.feed_eof()
        while (frame := await read_frame(reader)) is not None:
            ops.append(frame.header["op"])
        return ops

    before, after, writes = asyncio.run(scenario())
    assert len(writes) == 1, "four notifications and a call: one write"
    assert asyncio.run(ops(writes[0])) == ["set_priority"] * 4 + ["stats"]
    moved = after.kv_tokens["low_ref"] - before.kv_tokens["low_ref"]
    assert moved >= 4 * 16 and before.kv_tokens["high_ref"] - after.kv_tokens["high_ref"] == moved


def test_export_import_and_weights_cross_the_wire_as_raw_tensors(two_engines, tiny_model_dir):
    source, target = two_engines
    prompt = list(range(50, 82))
    weights = load_model(tiny_model_dir).state_dict()

    async def scenario():
        await _generate(source, prompt, None)
        prefix = await source.export_prefix(prompt)
        imported = await target.import_prefix(prompt[: prefix.tokens], prefix.kv)
        await target.update_weights(weights, 1)
        outputs = await _generate(target, prompt, None)
        return prefix, imported, outputs, await target.health()

    prefix, imported, outputs, health = asyncio.run(scenario())
    assert prefix.tokens == prefix.kv.num_tokens == 32 and imported == 32
    assert outputs[-1].weight_versions == [1] * GREEDY.max_new_tokens and health.weight_version == 1


def test_a_bad_request_fails_alone_and_the_engine_serves_on(two_engines):
    remote = two_engines[1]

    async def scenario():
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await _generate(remote, [10**9], None)
        with pytest.raises(ValueError, match="priority"):
            await remote.start_trajectory("x", 7)
        return (await _generate(remote, [1, 2, 3], None))[-1]

    assert asyncio.run(scenario()).finished


def test_bad_frames_get_a_clear_error_and_do_not_crash_the_engine(two_engines):
    remote = two_engines[1]

    async def exchange(data: bytes):
        reader, writer = await asyncio.open_connection(*remote.address)
        writer.write(data)
        frame = await read_frame(reader)
        assert frame.header == {"op": "demoted", "trajectories": []}  # what the engine sends a connection first
        frame = await read_frame(reader)
        writer.close()
        return frame.header if frame else None

    garbage = asyncio.run(exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
    unknown = asyncio.run(exchange(encode_bytes({"op": "explode", "id": 1})))
    not_json = asyncio.run(exchange(struct.pack(">4sIQ", b"VRL1", 3, 0) + b"{{{"))
    bad_field = asyncio.run(exchange(encode_bytes({"op": "release_trajectory", "id": 2, "trajectory_id": 5})))
    bad_tensor = asyncio.run(exchange(encode_bytes({"op": "stats", "id": 3, "tensors": [["k", "complex", [2]]]})))
    bad_index = asyncio.run(exchange(encode_bytes({"op": "steps_since", "id": 4, "index": -1})))
    assert garbage["kind"] == "WireError" and "not a venusrl engine frame" in garbage["error"]
    assert unknown["id"] == 1 and "unknown op 'explode'" in unknown["error"]
    assert "header is not JSON" in not_json["error"]
    assert bad_field["id"] == 2 and "'trajectory_id'" in bad_field["error"] and "must be str" in bad_field["error"]
    assert "dtype 'complex'" in bad_tensor["error"]
    assert bad_index["id"] == 4 and "index must be >= 0" in bad_index["error"]
    assert asyncio.run(remote.health()).alive


def test_a_killed_engine_process_surfaces_as_engine_stopped(tiny_model_dir):
    [remote] = spawn_engines([EngineSpec(model_dir=str(tiny_model_dir), engine=CONFIG)])
    long = SamplingParams(max_new_tokens=400, temperature=0, stop_token_ids=(-1,))

    async def scenario():
        stream = remote.generate(list(range(1, 9)), long, Priority.HIGH, "doomed")
        first = await anext(stream)
        os.kill(remote.process.pid, signal.SIGKILL)
        with pytest.raises(EngineStopped):
            async for _ in stream:
                pass
        with pytest.raises(EngineStopped):
            await remote.stats()
        return first, await remote.health()

    first, health = asyncio.run(scenario())
    assert not first.finished
    assert not health.alive and "-9" in health.error
    asyncio.run(remote.shutdown())  # on a dead process: returns


def test_a_remote_client_without_its_process_sees_a_dead_address_as_stopped(two_engines):
    closed = RemoteEngine(("127.0.0.1", 1), two_engines[0].info())

    async def scenario():
        with pytest.raises(EngineStopped, match="cannot be reached"):
            await _generate(closed, [1, 2], None)
        return await closed.health()

    assert not asyncio.run(scenario()).alive


def test_the_http_server_fronts_a_remote_engine(two_engines, tiny_model_dir, tiny_tokenizer):
    from fastapi.testclient import TestClient

    from venusrl.engine.server import create_app

    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    with TestClient(create_app(two_engines[0], tiny_tokenizer, "tiny")) as client:
        health = client.get("/health")
        completion = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 5,
                                                           "temperature": 0})
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert completion.status_code == 200, completion.text
    assert completion.json()["usage"]["prompt_tokens"] == len(prompt)


def test_a_bad_spec_or_model_is_a_clear_error_before_the_handshake(tmp_path):
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-m", "venusrl.engine.remote.process", "--spec", '{"engine": {"page_size": 0}}'],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "model_dir" in bad.stderr and "page_size" in bad.stderr
    with pytest.raises(RuntimeError, match=r"engine 0 \(pid \d+\) exited with code 1 before it was ready"):
        spawn_engines([EngineSpec(model_dir=str(tmp_path / "nothing-here"))])


def test_the_engine_pushes_its_demoted_set_whenever_it_changes(tiny_model_dir):
    """The client never asks for the set: the engine pushes it when a connection opens and
    at every iteration or call that changes it, ahead of that iteration's outputs, outputs or
    not (a stalled engine demotes at iterations that send nothing; a venus round once froze on
    a demotion the client had not heard of). B's 158 held tokens and A's growing context
    outgrow the 200-token pool, so the engine demotes while A streams: the client's set is
    non-empty between two of A's outputs, and at the end it matches the engine's own count.
    An engine it cannot reach is an error, not "none"."""
    unreachable = RemoteEngine(("127.0.0.1", 1), EngineInfo(1, 1, 1, 1, ()))
    with pytest.raises(EngineStopped):
        asyncio.run(unreachable.demoted_trajectories())
    [engine] = spawn_engines([EngineSpec(model_dir=str(tiny_model_dir),
                                         engine=EngineConfig(kv_capacity_tokens=200, page_size=1))])
    short = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(-1,))
    long = SamplingParams(max_new_tokens=160, temperature=0, stop_token_ids=(-1,))

    async def scenario():
        first = await engine.demoted_trajectories()
        await engine.start_trajectory("b", Priority.HIGH)
        await _generate(engine, list(range(100, 250)), "b", short)
        await engine.start_trajectory("a", Priority.HIGH)
        seen = [await engine.demoted_trajectories()
                async for _ in engine.generate(list(range(10, 40)), long, Priority.HIGH, "a")]
        return first, seen, await engine.demoted_trajectories(), await engine.stats()

    try:
        first, seen, last, stats = asyncio.run(scenario())
    finally:
        asyncio.run(engine.shutdown())
    assert first == frozenset()
    assert stats.demotions >= 1 and any(seen) and all(demoted <= {"a", "b"} for demoted in seen)
    assert len(last) == stats.demoted_trajectories


def test_bench_remote_throughput_pairs_the_placements_on_the_same_outputs(tiny_model_dir):
    from venusrl.bench.engine import ThroughputCase, remote_throughput

    result = remote_throughput(tiny_model_dir, ThroughputCase(batch=2, prompt_len=8, new_tokens=4), repeats=2)
    assert result["remote_greedy_match"] is True
    assert len(result["remote_ratio_per_repeat"]) == 2
    assert result["remote_ratio_min"] <= result["remote_ratio"] <= result["remote_ratio_max"]

