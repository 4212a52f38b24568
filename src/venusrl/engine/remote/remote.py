"""`RemoteEngine`: the `EngineClient` of an engine in another process (`engine/remote/process.py`),
over one connection per event loop speaking `engine/remote/wire.py`.

Every call is queued on its connection when it is made and the calls of one turn of the event
loop are written together as it ends (those made before the connection is up wait for it), so
calls take effect in the order they are made, and `set_priority`, a notification, needs no
reply. Stream outputs arrive in chunks (`outputs` frames, whatever the engine had ready); the
consumer gets one `RequestOutput` per chunk it reads, merging every chunk that arrived while
it was busy. The engine pushes its demoted set when the connection opens and whenever the set
changes, so `demoted_trajectories` needs no round trip. A connection that ends (the engine
process died, was killed, or shut down) fails every call and stream on it with `EngineStopped`.

`spawn_engines` starts local engine processes and returns their clients once each has
handshaken (a line on its stdout), with no timed wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import torch

from venusrl.engine.async_engine import EngineStopped, RequestFailed
from venusrl.engine.client import (
    EngineClient,
    EngineHealth,
    EngineInfo,
    KVAddress,
    PrefixKV,
    copy_prefix,
)
from venusrl.engine.engine import RequestOutput
from venusrl.engine.kv_pool import HostKV
from venusrl.engine.remote.wire import (
    WireError,
    address_of,
    encode,
    health_of,
    info_of,
    load_of,
    read_frame,
    sampling_to_wire,
    stats_of,
    steps_of,
)
from venusrl.engine.stats import EngineLoad, EngineStats
from venusrl.engine.step_log import StepLogSlice
from venusrl.types import Priority, SamplingParams
from venusrl.weights.layout import WeightLayout

log = logging.getLogger(__name__)

ERRORS: dict[str, type[Exception]] = {cls.__name__: cls for cls in (EngineStopped, RequestFailed, WireError,
                                                                     ValueError, KeyError)}
HANDSHAKE_TIMEOUT_S = 600.0  # loading a large checkpoint takes minutes
SHUTDOWN_TIMEOUT_S = 60.0


def _error(kind: str, message: str) -> Exception:
    return ERRORS.get(kind, RuntimeError)(message)


class _Connection:
    """One socket to the engine, bound to the event loop that opened it."""

    def __init__(self, address: tuple[str, int], loop: asyncio.AbstractEventLoop, client: RemoteEngine) -> None:
        self.address, self.loop, self.client = address, loop, client
        self.ids = itertools.count(1)
        self.calls: dict[int, asyncio.Future] = {}
        self.streams: dict[int, asyncio.Queue] = {}
        # frames not yet written: until connected, and within one turn of the event loop (`send`)
        self.pending: list[bytes | memoryview] = []
        self.flush_scheduled = False
        self.writer: asyncio.StreamWriter | None = None
        self.error: EngineStopped | None = None
        self.demoted: frozenset[str] = frozenset()  # as the engine last pushed it
        self.demoted_heard = asyncio.Event()  # its first push came, or the connection failed
        self.task = loop.create_task(self._run())

    def send(self, header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None) -> None:
        """Queue a frame; the frames sent within one turn of the event loop are written
        together, in order, when it ends (`_flush`). Each write wakes the engine process: the
        rollout worker sends its notifications in bursts (a policy change re-prioritises a
        group's trajectories, a preemption cancels and grants), and on shared cores a wake-up
        per frame cost the sender about 0.3 ms each (a round of the rollout bench's default
        cell: 4,332 writes for venus against 2,757 for action_level)."""
        if self.error is not None:
            raise self.error
        self.pending.extend(encode(header, tensors))
        if self.writer is not None and not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.pending and self.writer is not None and self.error is None:
            self.writer.writelines(self.pending)
            self.pending = []

    async def call(self, op: str, tensors: dict[str, torch.Tensor] | None = None, **fields: Any) -> Any:
        call_id = next(self.ids)
        future = self.loop.create_future()
        self.calls[call_id] = future
        try:
            self.send({"op": op, "id": call_id, **fields}, tensors)
            if tensors and self.writer is not None:  # a large frame: write it now, with backpressure
                self._flush()
                await self.writer.drain()
            return await future
        finally:
            self.calls.pop(call_id, None)

    def open_stream(self, fields: dict[str, Any]) -> tuple[int, asyncio.Queue]:
        stream_id = next(self.ids)
        queue: asyncio.Queue = asyncio.Queue()
        self.streams[stream_id] = queue
        try:
            self.send({"op": "generate", "id": stream_id, **fields})
        except EngineStopped:
            del self.streams[stream_id]
            raise
        return stream_id, queue

    def close_stream(self, stream_id: int, cancel: bool) -> None:
        self.streams.pop(stream_id, None)
        if cancel and self.error is None:
            self.send({"op": "cancel", "id": stream_id})

    async def _run(self) -> None:
        try:
            reader, writer = await asyncio.open_connection(*self.address)
        except OSError as err:
            self._fail(EngineStopped(f"engine at {self.address[0]}:{self.address[1]} cannot be reached: {err}"))
            return
        self.writer = writer
        self._flush()
        try:
            while True:
                frame = await read_frame(reader)
                if frame is None:
                    raise ConnectionError("the engine closed the connection")
                self._dispatch(frame.header, frame.tensors)
        except (OSError, WireError) as err:
            self._fail(EngineStopped(f"engine at {self.address[0]}:{self.address[1]} is gone: {err}"))
        finally:
            writer.close()

    def _dispatch(self, header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        op = header.get("op")
        if op == "outputs":
            for item in header["items"]:
                queue = self.streams.get(item["id"])
                if queue is not None:
                    queue.put_nowait(item)
        elif op == "reply":
            future = self.calls.get(header["id"])
            if future is None or future.done():
                return
            if "error" in header:
                future.set_exception(_error(header["kind"], header["error"]))
            else:
                future.set_result((header["result"], tensors) if tensors else header["result"])
        elif op == "demoted":
            self.demoted = frozenset(header["trajectories"])
            self.demoted_heard.set()
        elif op == "error":
            log.warning("engine at %s:%d refused a notification: %s", *self.address, header.get("error"))

    def _fail(self, error: EngineStopped) -> None:
        self.error = error
        self.demoted_heard.set()
        log.log(logging.INFO if self.client.closing else logging.WARNING, "%s", error)
        for future in self.calls.values():
            if not future.done():
                future.set_exception(error)
        for queue in self.streams.values():
            queue.put_nowait(error)

    def drop(self, error: EngineStopped) -> None:
        """Fail everything waiting on this connection with `error` and close it without waiting
        for the peer (one that stopped answering: nothing it sends later is read)."""
        if self.error is None:
            self._fail(error)
        self.task.cancel()
        if self.writer is not None:
            self.writer.transport.abort()

    def discard(self) -> None:
        """Drop a connection of another (possibly closed) loop: its calls cannot be awaited here."""
        if self.writer is not None and not self.loop.is_closed():
            self.writer.transport.abort()


class RemoteEngine:
    """An `EngineClient` for the engine served at `address` (a `process.EngineServer`)."""

    def __init__(self, address: tuple[str, int], info: EngineInfo, kv_address: KVAddress | None = None,
                 process: subprocess.Popen | None = None, name: str = "engine", hostname: str | None = None,
                 weight_rank: int | None = None) -> None:
        self.address, self._info, self._kv_address = address, info, kv_address
        self.process, self.name = process, name
        # where it runs, for the weight transport (weights/placement.py): its host's name, and
        # its rank in the weight group (None: not a member)
        self.hostname, self.weight_rank = hostname, weight_rank
        self.closing = False  # shutdown was called: the connection's end is expected
        self._connection: _Connection | None = None
        self._last_health = EngineHealth(True, 0, 0)

    @classmethod
    def from_handshake(cls, handshake: dict[str, Any], process: subprocess.Popen | None = None,
                       name: str = "engine") -> RemoteEngine:
        return cls(address_of(handshake["address"]), info_of(handshake["info"]),
                   address_of(handshake["kv_address"]), process, name, handshake.get("hostname"),
                   handshake.get("weight_rank"))

    def _conn(self) -> _Connection:
        loop = asyncio.get_running_loop()
        connection = self._connection
        if connection is None or connection.loop is not loop or connection.error is not None:
            if connection is not None and connection.loop is not loop:
                connection.discard()
            connection = self._connection = _Connection(self.address, loop, self)
        return connection

    def info(self) -> EngineInfo:
        return self._info

    def disconnect(self, reason: str) -> None:
        """Give up on the engine's current connection (it is lost, or its link is down): every
        call and stream on it fails now with `EngineStopped`; a later call connects anew."""
        if self._connection is not None:
            self._connection.drop(EngineStopped(f"{self.name} disconnected: {reason}"))

    @property
    def kv_address(self) -> KVAddress | None:
        return self._kv_address

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, priority: Priority | None = None,
                       trajectory_id: str | None = None) -> AsyncIterator[RequestOutput]:
        connection = self._conn()
        stream_id, queue = connection.open_stream({
            "prompt_ids": list(prompt_ids), "sampling": sampling_to_wire(sampling),
            "priority": None if priority is None else int(priority), "trajectory_id": trajectory_id})
        output_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finished = False
        try:
            while not finished:
                items = [await queue.get()]
                while not queue.empty():  # everything that arrived meanwhile is one output
                    items.append(queue.get_nowait())
                new_ids: list[int] = []
                new_logprobs: list[float] = []
                for item in items:
                    if isinstance(item, EngineStopped):
                        raise EngineStopped(f"{self.name} stopped while a request was running: {item}") from item
                    if "fail" in item:
                        finished = True  # the engine ended this stream
                        raise _error(item["kind"], item["fail"])
                    new_ids += item["new"]
                    new_logprobs += item["logprobs"]
                    versions += item["versions"]
                    last = item
                    if item["finished"]:
                        break
                output_ids += new_ids
                logprobs += new_logprobs
                if len(output_ids) != last["total"]:
                    raise WireError(f"stream of {last['rid']} has {len(output_ids)} tokens, the engine sent "
                                    f"{last['total']}")
                finished = last["finished"]
                if last["reason"] == "error":
                    raise RequestFailed(f"request {last['rid']} failed: {last['error']}")
                yield RequestOutput(last["rid"], last["trajectory_id"], last["prompt_len"], new_ids, new_logprobs,
                                    list(output_ids), list(logprobs), list(versions), finished, last["reason"],
                                    last["error"])
        finally:
            connection.close_stream(stream_id, cancel=not finished)

    async def abort(self, request_id: str) -> RequestOutput | None:
        output = await self._conn().call("abort", request_id=request_id)
        return None if output is None else RequestOutput(**output)

    def set_priority(self, trajectory_id: str, priority: Priority) -> None:
        try:
            self._conn().send({"op": "set_priority", "trajectory_id": trajectory_id, "priority": int(priority)})
        except EngineStopped as err:  # a notification has no caller to fail; the next call will
            log.warning("set_priority(%s) not sent: %s", trajectory_id, err)

    async def start_trajectory(self, trajectory_id: str, priority: Priority) -> None:
        await self._conn().call("start_trajectory", trajectory_id=trajectory_id, priority=int(priority))

    async def release_trajectory(self, trajectory_id: str) -> bool:
        return await self._conn().call("release_trajectory", trajectory_id=trajectory_id)

    async def demoted_trajectories(self) -> frozenset[str]:
        """As the engine last pushed it: it pushes the set whenever it changes, at iterations
        that send no outputs too (a stalled engine demotes), so this waits only for the first
        push on a new connection; an engine it cannot reach is an error, not "none"."""
        connection = self._conn()
        await connection.demoted_heard.wait()
        if connection.error is not None:
            raise connection.error
        return connection.demoted

    async def load(self) -> EngineLoad:
        return load_of(await self._conn().call("load"))

    async def stats(self) -> EngineStats:
        return stats_of(await self._conn().call("stats"))

    async def steps_since(self, index: int) -> StepLogSlice:
        return steps_of(await self._conn().call("steps_since", index=index))

    async def export_prefix(self, token_ids: list[int]) -> PrefixKV:
        tokens, tensors = await self._conn().call("export_prefix", token_ids=list(token_ids))
        return PrefixKV(tokens, HostKV(tensors["k"], tensors["v"]))

    async def import_prefix(self, token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> int:
        return await self._conn().call("import_prefix", {"k": kv.k, "v": kv.v}, token_ids=list(token_ids),
                                       trajectory_id=trajectory_id)

    async def send_prefix(self, token_ids: list[int], target: EngineClient, trajectory_id: str | None = None) -> int:
        if target.kv_address is None:  # the target is in the caller's process: through it
            return await copy_prefix(self, target, token_ids, trajectory_id)
        return await self._conn().call("send_prefix", token_ids=list(token_ids), to=list(target.kv_address),
                                       trajectory_id=trajectory_id)

    async def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """The tensors' bytes over the socket (the `socket` weight transport)."""
        await self._conn().call("update_weights", state_dict, version=version)

    async def update_weights_by(self, transport: str, version: int, layout: WeightLayout,
                                fields: dict[str, Any]) -> None:
        """A push whose bytes go another way (`shared`, `cuda_ipc`, `broadcast`: weights/):
        only the layout and where to find the bytes cross the socket."""
        await self._conn().call(f"update_weights_{transport}", version=version, layout=layout.to_wire(), **fields)

    async def weight_digest(self) -> str:
        """The engine's weights' fingerprint (weights/digest.py): a push checked end to end."""
        return await self._conn().call("weight_digest")

    async def health(self) -> EngineHealth:
        exit_code = None if self.process is None else self.process.poll()
        if exit_code is not None:
            return EngineHealth(False, self._last_health.weight_version, self._last_health.restarts,
                                f"{self.name} process exited with code {exit_code}")
        try:
            self._last_health = health_of(await self._conn().call("health"))
        except EngineStopped as err:
            error = str(err)
            if self.process is not None:  # unreachable: a dying process says how it ended
                with contextlib.suppress(subprocess.TimeoutExpired):
                    error = f"{self.name} process exited with code {await asyncio.to_thread(self.process.wait, 10)}"
            return EngineHealth(False, self._last_health.weight_version, self._last_health.restarts, error)
        return self._last_health

    async def ping(self) -> bool:
        """True once the engine's process answers, whatever its engine thread is doing."""
        return await self._conn().call("ping")

    async def shutdown(self) -> None:
        """Stop the engine process (when this client started it, wait for it to exit)."""
        self.closing = True
        with contextlib.suppress(EngineStopped):  # already gone
            await self._conn().call("shutdown")
        if self.process is not None:
            try:
                await asyncio.to_thread(self.process.wait, SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("%s did not exit within %.0f s of shutdown; killing it", self.name, SHUTDOWN_TIMEOUT_S)
                self.process.kill()
                await asyncio.to_thread(self.process.wait)
            if self.process.stdin is not None:
                self.process.stdin.close()


def spawn_engines(specs: Sequence[Any], timeout_s: float = HANDSHAKE_TIMEOUT_S) -> list[RemoteEngine]:
    """Start one engine process per `process.EngineSpec` (all at once: they load in parallel)
    and return their clients, each once its handshake line has arrived."""
    processes = [subprocess.Popen([sys.executable, "-m", "venusrl.engine.remote.process", "--spec", spec.model_dump_json()],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE) for spec in specs]
    clients: list[RemoteEngine] = []
    try:
        deadline = time.monotonic() + timeout_s
        for index, process in enumerate(processes):
            name = f"engine {index} (pid {process.pid})"
            handshake = _handshake(process, name, deadline)
            clients.append(RemoteEngine.from_handshake(handshake, process, name))
            log.info("%s ready at %s:%d", name, *clients[-1].address)
    except BaseException:
        for process in processes:
            process.kill()
            process.wait()
        raise
    return clients


def _handshake(process: subprocess.Popen, name: str, deadline: float) -> dict[str, Any]:
    """The engine process's first stdout line; waits on the pipe (readable or closed)."""
    ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise TimeoutError(f"{name} did not report ready in time")
    line = process.stdout.readline()
    if not line:
        code = process.wait()
        raise RuntimeError(f"{name} exited with code {code} before it was ready (its log is above)")
    process.stdout.close()
    return json.loads(line)
