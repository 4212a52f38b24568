"""The node agent's process: a threaded socket server in front of a NodeAgent.

Every connection starts with `{"token": ...}`; a wrong token closes it. Then each request
gets one reply, except `watch`, which turns the connection into the agent's event stream.
Run as `python -m venusrl.sandbox.node_server` with NodeSettings JSON on stdin; the first
stdout line is `READY <address>`. The agent shuts down (removing its cgroups and
sandboxes) on SIGTERM, on the `shutdown` request, or when its stdin closes (its parent
is gone).
"""

from __future__ import annotations

import logging
import os
import signal
import socketserver
import sys
import threading
from typing import Any

from venusrl.logs import setup_logging
from venusrl.sandbox import protocol
from venusrl.sandbox.errors import AuthenticationError, InvalidRequest, SandboxError
from venusrl.sandbox.node_agent import NodeAgent, NodeSettings
from venusrl.sandbox.transport import parse_address

log = logging.getLogger(__name__)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        stream = self.request.makefile("rwb")
        try:
            hello = protocol.receive(stream)
            if hello is None or not protocol.token_matches(hello.get("token"), self.server.token):
                protocol.send(stream, protocol.reply_error(AuthenticationError("bad or missing token")))
                return
            protocol.send(stream, protocol.reply_ok({"node_id": self.server.agent.settings.node_id}))
            while True:
                request = protocol.receive(stream)
                if request is None:
                    return
                if request.get("op") == "watch":
                    self._watch(stream)
                    return
                if request.get("op") == "shutdown":
                    protocol.send(stream, protocol.reply_ok(None))
                    threading.Thread(target=self.server.stop, daemon=True).start()
                    return
                protocol.send(stream, self._answer(request))
        except (OSError, SandboxError):
            return

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return protocol.reply_ok(self.server.agent.dispatch(request))
        except SandboxError as err:
            return protocol.reply_error(err)
        except (KeyError, TypeError, ValueError) as err:
            return protocol.reply_error(InvalidRequest(f"{type(err).__name__}: {err}"))
        except Exception as err:  # noqa: BLE001 - the caller gets the failure, the agent stays up
            log.exception("request %s failed", request.get("op"))
            return protocol.reply_error(SandboxError(f"{type(err).__name__}: {err}"))

    def _watch(self, stream: Any) -> None:
        agent = self.server.agent
        agent.add_watcher(stream)
        protocol.send(stream, protocol.reply_ok(None))
        try:
            while protocol.receive(stream) is not None:  # the watcher only ever closes
                pass
        finally:
            agent.remove_watcher(stream)


class _Server(socketserver.ThreadingMixIn, socketserver.BaseServer):
    daemon_threads = True
    request_queue_size = 512  # every concurrent caller opens a connection per call
    agent: NodeAgent
    token: str

    def stop(self) -> None:
        self.shutdown()


class _UnixServer(_Server, socketserver.UnixStreamServer):
    pass


class _TcpServer(_Server, socketserver.TCPServer):
    allow_reuse_address = True


def serve(settings: NodeSettings) -> None:
    kind, target = parse_address(settings.address)
    agent = NodeAgent(settings)
    try:
        if kind == "unix":
            old = os.umask(0o077)  # the socket is the owner's alone
            try:
                server: _Server = _UnixServer(target, _Handler)  # type: ignore[arg-type]
            finally:
                os.umask(old)
            address = settings.address
        else:
            server = _TcpServer(target, _Handler)  # type: ignore[arg-type]
            address = f"tcp:{target[0]}:{server.server_address[1]}"  # type: ignore[index]
        server.agent, server.token = agent, settings.token
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.stop, daemon=True).start())
        threading.Thread(target=_stop_on_eof, args=(server,), daemon=True).start()
        print(f"READY {address}", flush=True)
        server.serve_forever(poll_interval=0.2)
        server.server_close()
        if kind == "unix":
            os.unlink(target)  # type: ignore[arg-type]
    finally:
        agent.shutdown()


def _stop_on_eof(server: _Server) -> None:
    while sys.stdin.buffer.read(1 << 12):
        pass
    server.stop()


def main() -> None:
    setup_logging(os.environ.get("VENUSRL_LOG_LEVEL", "INFO"))
    settings = NodeSettings.from_json(sys.stdin.readline())
    serve(settings)


if __name__ == "__main__":
    main()
