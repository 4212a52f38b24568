"""envd's `process.Process` service: start commands in a sandbox, stream their output,
write their stdin, signal them, list them, attach to a running one.

Each started process gets a pump: one task that polls the sandbox's process table
(sandbox/processes.py, through the controller and the node agent) and fans the output out
to every stream attached to it (the Start call's, and any Connect's). The poll waits in the
sandbox until output or the exit arrives, so output reaches the client as soon as it is
read; an idle process is polled less and less often, up to WAIT_MAX_S apart.
A started process is killed when its Start call's timeout (Connect-Timeout-Ms, the SDK's
`timeout`) passes, as envd ties it to that request's deadline, whether or not the client is
still reading; a client that disconnects before then leaves it running.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request

from venusrl.sandbox.e2b import connect, rpc
from venusrl.sandbox.e2b.connect import ConnectError, field, selected_pid
from venusrl.sandbox.e2b.errors import connect_error
from venusrl.sandbox.e2b.sandboxes import E2BSandbox
from venusrl.sandbox.e2b.service import E2BService
from venusrl.sandbox.errors import SandboxError

log = logging.getLogger(__name__)

WAIT_MIN_S = 0.02
WAIT_MAX_S = 0.2
MAX_QUEUED = 16  # events a stream may lag behind; then the pump waits (and the process's pipe fills)
KEEPALIVE_DEFAULT_S = 50.0
SIGNALS = {"SIGNAL_SIGKILL": int(signal.SIGKILL), "SIGNAL_SIGTERM": int(signal.SIGTERM), 9: int(signal.SIGKILL),
           15: int(signal.SIGTERM)}

Event = tuple[str, Any]  # ("stdout"|"stderr", bytes) | ("end", poll reply) | ("error", ConnectError)


class Pump:
    def __init__(self, service: E2BService, sandbox_id: str, pid: int, on_done: Callable[[], None]) -> None:
        self.service, self.sandbox_id, self.pid = service, sandbox_id, pid
        self._queues: set[asyncio.Queue[Event]] = set()
        self._on_done = on_done
        self.task: asyncio.Task | None = None
        self._timer: asyncio.Task | None = None

    def subscribe(self) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue(MAX_QUEUED)
        self._queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        self._queues.discard(queue)
        while not queue.empty():  # frees a pump waiting to put into it
            queue.get_nowait()

    async def _publish(self, event: Event) -> None:
        """To every attached stream; a client that does not read holds the pump back rather
        than have its output pile up here (envd's backpressure)."""
        for queue in list(self._queues):
            await queue.put(event)

    def kill_at(self, deadline: float) -> None:
        async def kill() -> None:
            await asyncio.sleep(deadline - asyncio.get_running_loop().time())
            try:
                await self.service.call(self.service.controller.envd, self.sandbox_id, "signal", pid=self.pid,
                                        signal=int(signal.SIGKILL))
                log.info("e2b: sandbox %s process %d killed at its timeout", self.sandbox_id, self.pid)
            except SandboxError:
                pass  # it ended meanwhile, or its sandbox did

        self._timer = asyncio.get_running_loop().create_task(kill())

    async def run(self) -> None:
        wait = WAIT_MIN_S
        try:
            while True:
                reply = await self.service.call(self.service.controller.envd, self.sandbox_id, "poll",
                                                pid=self.pid, wait_s=wait)
                got = False
                for stream in ("stdout", "stderr"):
                    data = base64.b64decode(reply[stream])
                    if data:
                        await self._publish((stream, data))
                        got = True
                wait = WAIT_MIN_S if got else min(2 * wait, WAIT_MAX_S)
                if reply["exited"]:
                    await self._publish(("end", reply))
                    log.info("e2b: sandbox %s process %d ended: %s", self.sandbox_id, self.pid, reply["status"])
                    return
        except SandboxError as err:
            await self._publish(("error", connect_error(err, self.sandbox_id)))
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._on_done()


class Processes:
    """The pumps of every sandbox's running processes, by (sandbox id, pid)."""

    def __init__(self, service: E2BService) -> None:
        self.service = service
        self._pumps: dict[tuple[str, int], Pump] = {}

    def start(self, sandbox_id: str, pid: int) -> tuple[Pump, asyncio.Queue[Event]]:
        key = (sandbox_id, pid)
        pump = Pump(self.service, sandbox_id, pid, lambda: self._pumps.pop(key, None))
        queue = pump.subscribe()  # before the pump runs: the first output is not missed
        self._pumps[key] = pump
        pump.task = asyncio.get_running_loop().create_task(pump.run())
        return pump, queue

    def get(self, sandbox_id: str, pid: int) -> Pump | None:
        return self._pumps.get((sandbox_id, pid))


def _event(payload: dict[str, Any]) -> bytes:
    return connect.envelope({"event": payload})


def _end(reply: dict[str, Any]) -> dict[str, Any]:
    end = {"exitCode": reply["exit_code"], "exited": reply["normal_exit"], "status": reply["status"]}
    return {"end": end}


async def _stream(pump: Pump, queue: asyncio.Queue[Event], deadline: float | None,
                  keepalive_s: float) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    try:
        yield _event({"start": {"pid": pump.pid}})
        while True:
            wait = keepalive_s if deadline is None else min(keepalive_s, deadline - loop.time())
            if wait <= 0:
                yield connect.end_of_stream(ConnectError("deadline_exceeded", f"process {pump.pid}: the timeout passed"))
                return
            try:
                kind, payload = await asyncio.wait_for(queue.get(), wait)
            except asyncio.TimeoutError:
                if deadline is None or loop.time() < deadline:
                    yield _event({"keepalive": {}})
                continue
            if kind in ("stdout", "stderr"):
                yield _event({"data": {kind: base64.b64encode(payload).decode()}})
            elif kind == "end":
                yield _event(_end(payload))
                yield connect.end_of_stream()
                return
            else:
                yield connect.end_of_stream(payload)
                return
    finally:
        pump.unsubscribe(queue)


def _deadline(request: Request) -> float | None:
    seconds = connect.timeout_ms(request.headers.get("connect-timeout-ms"))
    return None if seconds is None else asyncio.get_running_loop().time() + seconds


def _keepalive(request: Request) -> float:
    value = request.headers.get("keepalive-ping-interval", "")
    return float(value) if connect.decimal(value) and int(value) > 0 else KEEPALIVE_DEFAULT_S


def build_router(service: E2BService) -> APIRouter:
    router = APIRouter()
    processes = Processes(service)
    controller = service.controller

    async def envd(record: E2BSandbox, op: str, **fields: Any) -> Any:
        return await service.call(controller.envd, record.sandbox_id, op, **fields)

    async def start(record: E2BSandbox, message: dict[str, Any], request: Request) -> AsyncIterator[bytes]:
        config = field(message, "process", dict, None)
        if config is None:
            raise ConnectError("invalid_argument", "process: the process config is required")
        if message.get("pty") is not None:
            raise ConnectError("unimplemented", "pty: pseudo-terminals are not served; run the command without one")
        cmd = field(config, "cmd", str, None, "process.")
        if not cmd:
            raise ConnectError("invalid_argument", "process.cmd: required")
        args = field(config, "args", list, [], "process.")
        envs = field(config, "envs", dict, {}, "process.")
        cwd = field(config, "cwd", str, None, "process.")
        stdin = field(message, "stdin", bool, False)
        tag = field(message, "tag", str, None)
        deadline = _deadline(request)
        pid = (await envd(record, "spawn", cmd=cmd, args=args, env={**record.env_vars, **envs}, cwd=cwd or None,
                          stdin=stdin, tag=tag))["pid"]
        log.info("e2b: sandbox %s process %d started: %s %s", record.sandbox_id, pid, cmd, " ".join(map(str, args))[:200])
        pump, queue = processes.start(record.sandbox_id, pid)
        if deadline is not None:
            pump.kill_at(deadline)
        return _stream(pump, queue, deadline, _keepalive(request))

    async def attach(record: E2BSandbox, message: dict[str, Any], request: Request) -> AsyncIterator[bytes]:
        pid = selected_pid(message)
        pump = processes.get(record.sandbox_id, pid)
        if pump is None:
            raise ConnectError("not_found", f"process.pid: no running process {pid}")
        return _stream(pump, pump.subscribe(), _deadline(request), _keepalive(request))

    async def list_processes(record: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        found = await envd(record, "processes")
        return {"processes": [{"pid": p["pid"], "config": p["config"], **({"tag": p["tag"]} if p["tag"] else {})}
                              for p in found]}

    async def send_input(record: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        pid = selected_pid(message)
        given = field(message, "input", dict, {})
        if "pty" in given:
            raise ConnectError("unimplemented", "input.pty: pseudo-terminals are not served")
        data = field(given, "stdin", str, None, "input.")
        if data is None:
            raise ConnectError("invalid_argument", "input.stdin: required (base64 bytes)")
        if data:
            await envd(record, "stdin", pid=pid, data=_base64(data, "input.stdin"))
        return {}

    async def send_signal(record: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        pid = selected_pid(message)
        given = message.get("signal")
        signum = SIGNALS.get(given) if isinstance(given, (str, int)) else None
        if signum is None:
            raise ConnectError("invalid_argument", f"signal: expected SIGNAL_SIGKILL or SIGNAL_SIGTERM, got {given!r}")
        await envd(record, "signal", pid=pid, signal=signum)
        return {}

    async def close_stdin(record: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        await envd(record, "close_stdin", pid=selected_pid(message))
        return {}

    base = "/process.Process"
    router.add_api_route(f"{base}/Start", rpc.server_stream(service, start), methods=["POST"])
    router.add_api_route(f"{base}/Connect", rpc.server_stream(service, attach), methods=["POST"])
    router.add_api_route(f"{base}/List", rpc.unary(service, list_processes), methods=["POST"])
    router.add_api_route(f"{base}/SendInput", rpc.unary(service, send_input), methods=["POST"])
    router.add_api_route(f"{base}/SendSignal", rpc.unary(service, send_signal), methods=["POST"])
    router.add_api_route(f"{base}/CloseStdin", rpc.unary(service, close_stdin), methods=["POST"])
    router.add_api_route(f"{base}/Update", rpc.unimplemented(service, "Update (pty resize)"), methods=["POST"])
    router.add_api_route(f"{base}/StreamInput", rpc.unimplemented(service, "StreamInput (client streaming; use send_stdin)"),
                         methods=["POST"])
    return router


def _base64(data: str, name: str) -> str:
    try:
        base64.b64decode(data, validate=True)
    except ValueError:
        raise ConnectError("invalid_argument", f"{name}: not base64") from None
    return data
