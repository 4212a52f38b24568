"""An engine in its own OS process (or Ray actor), serving the `EngineClient` calls over
`engine/remote/wire.py` to `RemoteEngine` clients.

    python -m venusrl.engine.remote.process --spec '{"model_dir": "DIR", "engine": {...}}' [--port 0]

loads the model, starts the engine thread (`AsyncEngine`), the wire server and a KV receiver
(other engines' `send_prefix` lands there), then prints one JSON line, the handshake: its
address, KV address, `EngineInfo` and pid. The parent (`remote.spawn_engines`) waits for that
line, not for a time. The process ends on a `shutdown` call, or when its stdin closes (the
parent is gone).

Order: each frame a connection sends becomes one task, created in arrival order; a task's
first step makes its engine call, which queues it on the engine thread in that order. So a
`set_priority` notification is applied before every call sent after it on that connection.
Stream outputs ready together go out in one `outputs` frame. The engine's demoted set is
pushed in a `demoted` frame, first when a connection opens, then each time it changes (at an
iteration that sends no outputs too), ahead of that iteration's outputs: a client knows it
without asking.

A bad frame or message gets an error reply naming what was wrong; only a connection whose
framing is lost is closed, and the engine serves on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import torch
from pydantic import BaseModel, Field

from venusrl.engine.async_engine import AsyncEngine, EngineStopped, RequestFailed
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.kv_pool import HostKV
from venusrl.engine.remote.wire import (
    Frame,
    WireError,
    address_of,
    encode,
    field_of,
    info_to_wire,
    load_to_wire,
    output_to_wire,
    priority_of,
    read_frame,
    sampling_of,
    steps_to_wire,
    token_ids_of,
)
from venusrl.weights.broadcast import GroupSpec, WeightGroup
from venusrl.weights.cuda_ipc import CudaIpcReader
from venusrl.weights.layout import WeightLayout
from venusrl.weights.shared_memory import SharedMemoryReader

log = logging.getLogger(__name__)

ERROR_KINDS = (EngineStopped, RequestFailed, WireError, ValueError, KeyError)


class EngineSpec(BaseModel):
    """Everything an engine process needs to build its engine; JSON on its command line."""

    model_dir: str
    engine: EngineConfig = Field(default_factory=EngineConfig)
    dtype: str = "float32"
    device: str = "cpu"
    weight_version: int = 0
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    tool_call_format: str = "auto"
    kv_transport: str = Field("tcp", description="how other engines' prefix KV reaches this one: tcp or mooncake")
    host: str = Field("127.0.0.1", description="address the wire server and KV receiver bind and advertise")
    torch_threads: int | None = Field(None, description="torch intra-op threads (None: torch's default)")
    weight_group: GroupSpec | None = Field(
        None, description="the weight group this engine joins (rank >= 1) to take pushes by broadcast "
        "(weights/broadcast.py); None: pushes come over the socket, shared memory or CUDA IPC")


def build_engine(spec: EngineSpec) -> AsyncEngine:
    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    engine = Engine.from_pretrained(spec.model_dir, spec.engine, spec.dtype, spec.device)
    engine.weight_version = spec.weight_version
    engine.tokenizer.configure(spec.chat_template_kwargs, spec.tool_call_format)
    return AsyncEngine(engine)


def error_kind(err: BaseException) -> str:
    return next((kind.__name__ for kind in ERROR_KINDS if isinstance(err, kind)), "RuntimeError")


class EngineServer:
    """The wire server over one `AsyncEngine`, on the running event loop."""

    def __init__(self, engine: AsyncEngine, host: str = "127.0.0.1", kv_transport: str = "tcp") -> None:
        self.engine, self.host, self.kv_transport = engine, host, kv_transport
        self.stopped = asyncio.Event()
        self.address: tuple[str, int] | None = None
        self.kv_address: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._receiver = None
        self._connections: set[_Connection] = set()
        # how pushed weights reach this process other than over the socket (weights/)
        self.shared_weights = SharedMemoryReader()
        self.ipc_weights = CudaIpcReader()
        self.weight_group: WeightGroup | None = None

    def join_weight_group(self, spec: GroupSpec) -> None:
        """Join in the background (the pushing process joins as rank 0 after starting us);
        the first broadcast waits for it."""
        self.weight_group = WeightGroup(spec)

    async def start(self, port: int = 0) -> dict[str, Any]:
        """Serve; returns the handshake (what a `RemoteEngine` needs to reach this engine)."""
        from venusrl.rollout.transport_select import open_receiver

        loop = asyncio.get_running_loop()

        def on_kv(token_ids: list[int], kv: HostKV, trajectory_id: str | None) -> int:  # the receiver's thread
            return asyncio.run_coroutine_threadsafe(self.engine.import_prefix(token_ids, kv, trajectory_id),
                                                    loop).result()

        self._receiver = open_receiver(self.kv_transport, on_kv, self.host)
        self.kv_address = address_of(self._receiver.address)
        self._server = await asyncio.start_server(self._serve, self.host, port)
        self.address = address_of(self._server.sockets[0].getsockname()[:2])
        log.info("engine serving on %s:%d (KV over %s at %s:%d), pid %d", *self.address, self.kv_transport,
                 *self.kv_address, os.getpid())
        return self.handshake()

    def handshake(self) -> dict[str, Any]:
        return {"address": list(self.address), "kv_address": list(self.kv_address), "kv_transport": self.kv_transport,
                "info": info_to_wire(self.engine.info()), "pid": os.getpid(), "hostname": socket.gethostname(),
                "weight_rank": None if self.weight_group is None else self.weight_group.spec.rank}

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        if self._receiver is not None:
            await asyncio.to_thread(self._receiver.close)
        await self.engine.shutdown()
        self.stopped.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(self, reader, writer)
        self._connections.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)

    async def send_prefix(self, token_ids: list[int], to: tuple[str, int], trajectory_id: str | None) -> int:
        """This engine's cached prefix KV of `token_ids`, sent over the KV transport to the
        receiver at `to`; the tokens the receiving engine took."""
        from venusrl.rollout.transport_select import sender

        prefix = await self.engine.export_prefix(token_ids)
        if not prefix.tokens:
            return 0
        transport = sender(self.kv_transport, to, self.host)
        taken, _ = await asyncio.to_thread(transport.send, token_ids[: prefix.tokens], prefix.kv, trajectory_id)
        return len(taken)


class _Connection:
    """One client connection: frames in, replies and coalesced stream outputs out."""

    def __init__(self, server: EngineServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server, self.engine = server, server.engine
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()
        self.streams: dict[int, asyncio.Task] = {}
        self.tasks: set[asyncio.Task] = set()
        self.outbox: list[dict[str, Any]] = []
        self.peer = writer.get_extra_info("peername")
        self.handlers: dict[str, Callable[[dict[str, Any], Frame], Awaitable[Any]]] = {
            "abort": self._abort, "start_trajectory": self._start_trajectory,
            "release_trajectory": self._release_trajectory,
            "load": self._load, "stats": self._stats, "steps_since": self._steps_since,
            "export_prefix": self._export_prefix,
            "import_prefix": self._import_prefix, "send_prefix": self._send_prefix,
            "update_weights": self._update_weights, "update_weights_shared": self._update_weights_shared,
            "update_weights_cuda_ipc": self._update_weights_cuda_ipc,
            "update_weights_broadcast": self._update_weights_broadcast,
            "weight_digest": self._weight_digest, "health": self._health, "ping": self._ping,
            "shutdown": self._shutdown,
        }

        # each change of the engine's demoted set is pushed from this connection's loop; a push
        # sends the set as it is then, so pushes overtaken by later changes send the latest
        self.unwatch = self.engine.watch_demoted(lambda: self.loop.call_soon_threadsafe(self._push_demoted))

    async def run(self) -> None:
        self._push_demoted()  # its first frame
        try:
            while True:
                try:
                    frame = await read_frame(self.reader)
                except WireError as err:  # the framing is lost: say why, close this connection only
                    log.warning("bad frame from %s, closing its connection: %s", self.peer, err)
                    self.send({"op": "error", "id": None, "error": f"bad frame: {err}", "kind": "WireError"})
                    await self.writer.drain()
                    return
                if frame is None:
                    return
                self.dispatch(frame)
        except ConnectionError:
            return
        finally:
            self.close()

    def close(self) -> None:
        self.unwatch()
        for task in [*self.streams.values(), *self.tasks]:
            task.cancel()  # a cancelled stream aborts its request (its KV stays cached)
        self.writer.close()

    def dispatch(self, frame: Frame) -> None:
        header = frame.header
        op, call_id = header.get("op"), header.get("id")
        if call_id is not None and (not isinstance(call_id, int) or isinstance(call_id, bool)):
            self._reject(None, WireError(f"message id must be an integer, got {str(call_id)[:40]}"))
            return
        if op in ("generate", "cancel") and call_id is None:
            self._reject(None, WireError(f"{op} needs the integer id of its stream"))
        elif op == "generate" and call_id in self.streams:
            self._reject(None, WireError(f"stream id {call_id} is already streaming on this connection"))
        elif op == "generate":
            self._spawn(self._stream(call_id, header), call_id)
        elif op == "cancel":
            task = self.streams.get(call_id)
            if task is not None:
                task.cancel()
        elif op == "set_priority":
            self._spawn(self._set_priority(header), None)
        elif op in self.handlers:
            self._spawn(self._call(call_id, op, header, frame), None)
        else:
            self._reject(call_id, WireError(f"unknown op {str(op)[:40]!r}: one of generate, cancel, set_priority, "
                                            f"{', '.join(self.handlers)}"))

    def _spawn(self, coro, stream_id: int | None) -> None:
        task = self.loop.create_task(coro)  # tasks start in creation order: engine calls queue in frame order
        if stream_id is not None:
            self.streams[stream_id] = task
            task.add_done_callback(lambda _: self.streams.pop(stream_id, None))
        else:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def send(self, header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None) -> None:
        if not self.writer.is_closing():
            self.writer.writelines(encode(header, tensors))

    def _reject(self, call_id: int | None, err: BaseException) -> None:
        log.warning("request from %s refused: %s", self.peer, err)
        self.send({"op": "reply" if call_id is not None else "error", "id": call_id, "error": str(err),
                   "kind": error_kind(err)})

    def _push_demoted(self) -> None:
        self.send({"op": "demoted", "trajectories": sorted(self.engine.demoted)})

    # ---- streams ---------------------------------------------------------------------------

    def emit(self, item: dict[str, Any]) -> None:
        """Queue a stream item; everything queued before the loop next runs goes in one frame."""
        if not self.outbox:
            self.loop.call_soon(self._flush)
        self.outbox.append(item)

    def _flush(self) -> None:
        items, self.outbox = self.outbox, []
        self.send({"op": "outputs", "items": items})

    async def _stream(self, stream_id: int, header: dict[str, Any]) -> None:
        try:
            outputs = self.engine.generate(token_ids_of(header, "prompt_ids"), sampling_of(header),
                                           priority_of(header, optional=True),
                                           field_of(header, "trajectory_id", str, optional=True))
            sent = 0
            async for output in outputs:
                self.emit(output_to_wire(stream_id, output, sent))
                sent = len(output.output_ids)
        except Exception as err:  # this stream fails; the connection and the engine go on
            if not isinstance(err, (RequestFailed, EngineStopped)):
                log.warning("generate from %s refused: %s", self.peer, err)
            self.emit({"id": stream_id, "fail": str(err), "kind": error_kind(err)})

    # ---- calls -----------------------------------------------------------------------------

    async def _call(self, call_id: int | None, op: str, header: dict[str, Any], frame: Frame) -> None:
        try:
            result = await self.handlers[op](header, frame)
        except Exception as err:
            if call_id is None:
                self._reject(None, err)
            else:
                self.send({"op": "reply", "id": call_id, "error": str(err), "kind": error_kind(err)})
            return
        if call_id is not None:
            result, tensors = result if isinstance(result, tuple) else (result, None)
            self.send({"op": "reply", "id": call_id, "result": result}, tensors)
        if op == "shutdown":
            await self.writer.drain()
            self.loop.create_task(self.server.close())

    async def _set_priority(self, header: dict[str, Any]) -> None:
        try:
            trajectory_id = field_of(header, "trajectory_id", str)
            priority = priority_of(header)
        except WireError as err:
            self._reject(None, err)
            return
        self.engine.set_priority(trajectory_id, priority)

    async def _abort(self, header, frame):
        output = await self.engine.abort(field_of(header, "request_id", str))
        return None if output is None else asdict(output)

    async def _start_trajectory(self, header, frame):
        await self.engine.start_trajectory(field_of(header, "trajectory_id", str), priority_of(header))

    async def _release_trajectory(self, header, frame):
        return await self.engine.release_trajectory(field_of(header, "trajectory_id", str))

    async def _load(self, header, frame):
        return load_to_wire(await self.engine.load())

    async def _stats(self, header, frame):
        return (await self.engine.stats()).to_dict()

    async def _steps_since(self, header, frame):
        index = field_of(header, "index", int)
        if index < 0:
            raise WireError(f"steps_since: index must be >= 0, got {index}")
        return steps_to_wire(await self.engine.steps_since(index))

    async def _export_prefix(self, header, frame):
        prefix = await self.engine.export_prefix(token_ids_of(header))
        return prefix.tokens, {"k": prefix.kv.k, "v": prefix.kv.v}

    async def _import_prefix(self, header, frame):
        if set(frame.tensors) != {"k", "v"}:
            raise WireError(f"import_prefix carries tensors k and v, got {sorted(frame.tensors)}")
        return await self.engine.import_prefix(token_ids_of(header), HostKV(frame.tensors["k"], frame.tensors["v"]),
                                               field_of(header, "trajectory_id", str, optional=True))

    async def _send_prefix(self, header, frame):
        to = field_of(header, "to", list)
        if len(to) != 2 or not isinstance(to[0], str) or not isinstance(to[1], int):
            raise WireError(f"field 'to' must be [host, port], got {str(to)[:80]}")
        return await self.server.send_prefix(token_ids_of(header), address_of(to),
                                             field_of(header, "trajectory_id", str, optional=True))

    async def _update_weights(self, header, frame):
        await self.engine.update_weights(dict(frame.tensors), field_of(header, "version", int))

    async def _update_weights_shared(self, header, frame):
        version = field_of(header, "version", int)
        views = self.server.shared_weights.views(field_of(header, "path", str), field_of(header, "size", int),
                                                 WeightLayout.from_wire(header.get("layout")), version)
        await self.engine.update_weights(views, version)

    async def _update_weights_cuda_ipc(self, header, frame):
        views = self.server.ipc_weights.views(field_of(header, "handle", dict),
                                              WeightLayout.from_wire(header.get("layout")))
        await self.engine.update_weights(views, field_of(header, "version", int))

    async def _update_weights_broadcast(self, header, frame):
        group = self.server.weight_group
        if group is None:
            raise WireError("update_weights_broadcast: this engine is in no weight group (EngineSpec.weight_group)")
        nbytes = field_of(header, "nbytes", int)
        # received whole before anything is checked: every rank takes part in every broadcast
        buffer = await asyncio.to_thread(group.receive, nbytes, self.engine.engine.runner.device)
        views = WeightLayout.from_wire(header.get("layout")).views(buffer)
        await self.engine.update_weights(views, field_of(header, "version", int))

    async def _weight_digest(self, header, frame):
        return await self.engine.weight_digest()

    async def _health(self, header, frame):
        return asdict(await self.engine.health())

    async def _ping(self, header, frame):
        """Answered by this server's event loop, never queued behind the engine thread (a
        long weight load there): the process and the link to it are up."""
        return True

    async def _shutdown(self, header, frame):
        log.info("engine shutting down at the request of %s", self.peer)


# ---- the process entry point ---------------------------------------------------------------

def _exit_when_parent_goes(loop: asyncio.AbstractEventLoop, server: EngineServer) -> None:
    """The parent holds our stdin open: its end (the parent exited or was killed) ends us."""

    def watch() -> None:
        while os.read(sys.stdin.fileno(), 4096):  # unbuffered: nothing to lock at interpreter exit
            pass
        log.info("parent gone (stdin closed): engine process exiting")
        loop.call_soon_threadsafe(lambda: loop.create_task(server.close()))

    threading.Thread(target=watch, name="venusrl-parent-watch", daemon=True).start()


async def _main(spec: EngineSpec, port: int) -> None:
    engine = await asyncio.to_thread(build_engine, spec)
    server = EngineServer(engine, spec.host, spec.kv_transport)
    if spec.weight_group is not None:
        server.join_weight_group(spec.weight_group)
    handshake = await server.start(port)
    out = sys.stdout
    out.write(json.dumps(handshake) + "\n")
    out.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # later prints cannot corrupt the handshake pipe
    _exit_when_parent_goes(asyncio.get_running_loop(), server)
    await server.stopped.wait()


def main(argv: list[str] | None = None) -> None:
    from venusrl.logs import setup_logging

    parser = argparse.ArgumentParser(prog="python -m venusrl.engine.remote.process", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="EngineSpec as JSON")
    parser.add_argument("--port", type=int, default=0, help="wire port (0: any free one; the handshake says which)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        spec = EngineSpec.model_validate_json(args.spec)
    except ValueError as err:
        parser.error(f"--spec: {err}")
    asyncio.run(_main(spec, args.port))


if __name__ == "__main__":
    main()
