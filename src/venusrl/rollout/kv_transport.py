"""Moving a request's prefix KV between engines, host memory to host memory.

`InProcessTransport` hands the tensors over (engines in one process); `TcpTransport` sends
them to a `KVReceiver` on another process over a socket (loopback by default): a JSON header
line (shapes, dtype, token ids, the trajectory that will resume on them), then the raw K and V
bytes. Engine processes send each other prefix KV this way (`EngineClient.send_prefix`). `mooncake_transport.py` moves
the bytes through Mooncake's transfer engine instead; `transport_select.py` picks one by name.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from venusrl.engine.kv_pool import HostKV
from venusrl.model.checkpoint import resolve_dtype

log = logging.getLogger(__name__)


class KVTransport(Protocol):
    def send(self, token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> tuple[list[int], HostKV]:
        """Deliver the KV of token_ids (for `trajectory_id` to resume on, when given); returns
        what the receiving side holds."""
        ...


# The receiving engine's import: token ids, their KV, the trajectory; returns the tokens taken.
OnKV = Callable[[list[int], HostKV, str | None], int]


class InProcessTransport:
    def send(self, token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> tuple[list[int], HostKV]:
        return list(token_ids), HostKV(kv.k.clone(), kv.v.clone())


def kv_header(token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> dict:
    """What the receiving side needs to rebuild K and V: token ids, shape and dtype."""
    return {"token_ids": token_ids, "shape": list(kv.k.shape), "dtype": str(kv.k.dtype).removeprefix("torch."),
            "trajectory_id": trajectory_id}


def _encode(token_ids: list[int], kv: HostKV, trajectory_id: str | None) -> tuple[bytes, bytes, bytes]:
    raw = [t.contiguous().view(torch.uint8).numpy().tobytes() for t in (kv.k, kv.v)]
    return (json.dumps(kv_header(token_ids, kv, trajectory_id)) + "\n").encode(), raw[0], raw[1]


def _read_exact(stream, count: int) -> bytes:
    data = stream.read(count)
    if len(data) != count:
        raise ConnectionError(f"KV stream ended after {len(data)} of {count} bytes")
    return data


@dataclass(slots=True, frozen=True)
class KVDelivery:
    token_ids: list[int]
    kv: HostKV
    trajectory_id: str | None = None


def _decode(stream) -> KVDelivery:
    header = json.loads(stream.readline())
    dtype = resolve_dtype(header["dtype"])
    shape = header["shape"]
    count = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    k, v = (torch.frombuffer(bytearray(_read_exact(stream, count)), dtype=dtype).view(shape) if count
            else torch.empty(shape, dtype=dtype) for _ in range(2))
    return KVDelivery(header["token_ids"], HostKV(k, v), header.get("trajectory_id"))


class KVReceiver:
    """Accepts KV sent by `TcpTransport` and hands each delivery to `on_kv` (which imports it
    into the local engine); replies with the tokens it took. `on_kv` runs on the receiver's
    thread: with a running `AsyncEngine`, hand the import to its loop (`engine/remote/process.py`).
    A subclass that carries the KV bytes another way overrides `receive`."""

    def __init__(self, on_kv: OnKV, host: str = "127.0.0.1", port: int = 0):
        receiver = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                delivery = receiver.receive(self.rfile)
                imported = receiver.on_kv(delivery.token_ids, delivery.kv, delivery.trajectory_id)
                self.wfile.write((json.dumps({"imported": imported}) + "\n").encode())

        self.on_kv = on_kv
        self.server = socketserver.ThreadingTCPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.address = self.server.server_address
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def receive(self, stream) -> KVDelivery:
        """One delivery read from the connection's stream."""
        return _decode(stream)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TcpTransport:
    def __init__(self, address: tuple[str, int], timeout_s: float = 30.0):
        self.address, self.timeout_s = address, timeout_s

    def send(self, token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> tuple[list[int], HostKV]:
        start = time.perf_counter()
        header, k, v = _encode(token_ids, kv, trajectory_id)
        with socket.create_connection(self.address, timeout=self.timeout_s) as connection:
            connection.sendall(header + k + v)
            reply = json.loads(connection.makefile("rb").readline())
        log.info("KV of %d tokens sent over tcp to %s: %d bytes in %.1f ms, %d tokens imported", len(token_ids),
                 self.address, len(k) + len(v), (time.perf_counter() - start) * 1e3, reply["imported"])
        return list(token_ids[: reply["imported"]]), kv
