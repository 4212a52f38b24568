"""Client of one node agent. One short connection per call, so calls from many threads
run concurrently; the `watch` stream is one long connection read by its own thread."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from venusrl.sandbox import protocol, transport
from venusrl.sandbox.errors import SandboxUnavailable

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0


class NodeClient:
    def __init__(self, node_id: str, address: str, token: str, call_grace_s: float = 60.0) -> None:
        transport.parse_address(address)  # reject non-loopback addresses up front
        self.node_id = node_id
        self.address = address
        self._token = token
        self.call_grace_s = call_grace_s

    def _open(self, timeout: float) -> tuple[Any, Any]:
        try:
            sock = transport.connect(self.address, CONNECT_TIMEOUT_S)
        except OSError as err:
            raise SandboxUnavailable(f"node {self.node_id}: cannot connect to {self.address} ({err})") from None
        sock.settimeout(timeout)
        stream = sock.makefile("rwb")
        try:
            protocol.send(stream, {"token": self._token})
            protocol.unwrap(protocol.receive(stream), f"node {self.node_id} hello")
        except (OSError, TimeoutError) as err:
            sock.close()
            raise SandboxUnavailable(f"node {self.node_id}: handshake failed ({err})") from None
        except BaseException:
            sock.close()
            raise
        return sock, stream

    def call(self, op: str, wait_s: float = 60.0, **fields: Any) -> Any:
        """One request. A node that dies or stalls past `wait_s` (plus grace) raises the
        retryable SandboxUnavailable; errors the node reports are raised as they are."""
        sock, stream = self._open(wait_s + self.call_grace_s)
        try:
            protocol.send(stream, {"op": op, **fields})
            reply = protocol.receive(stream)
        except (OSError, TimeoutError) as err:
            raise SandboxUnavailable(f"node {self.node_id}: {op} failed ({err})") from None
        finally:
            sock.close()
        if reply is None:
            raise SandboxUnavailable(f"node {self.node_id}: connection closed during {op}")
        return protocol.unwrap(reply, f"node {self.node_id} {op}")

    def watch(self, on_event: Callable[[dict[str, Any]], None], on_lost: Callable[[], None]) -> threading.Thread:
        """Read the node's events on a thread; `on_lost` runs once when the stream ends."""
        sock, stream = self._open(CONNECT_TIMEOUT_S)
        protocol.send(stream, {"op": "watch"})
        protocol.unwrap(protocol.receive(stream), f"node {self.node_id} watch")
        sock.settimeout(None)
        self._watch_sock = sock

        def loop() -> None:
            try:
                while True:
                    event = protocol.receive(stream)
                    if event is None:
                        break
                    on_event(event)
            except (OSError, protocol.ProtocolError):
                pass
            finally:
                sock.close()
            on_lost()

        thread = threading.Thread(target=loop, name=f"watch-{self.node_id}", daemon=True)
        thread.start()
        return thread

    def stop_watching(self) -> None:
        sock = getattr(self, "_watch_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
