"""Choosing a KV transport by name: `in_process`, `tcp`, or `mooncake` (Mooncake's transfer
engine, when the `mooncake-transfer-engine` package is installed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from venusrl.engine.kv_pool import HostKV
from venusrl.rollout.kv_transport import InProcessTransport, KVReceiver, KVTransport, TcpTransport
from venusrl.rollout.mooncake_transport import MooncakeKVReceiver, MooncakeTransport

TRANSPORTS = ("in_process", "tcp", "mooncake")


@contextmanager
def open_transport(kind: str, on_kv: Callable[[list[int], HostKV], int],
                   host: str = "127.0.0.1") -> Iterator[KVTransport]:
    """A transport of `kind` to a receiver on `host` that hands each delivery to `on_kv` (the
    receiving engine's import, returning the tokens it took); the receiver closes on exit.
    `in_process` has no receiver: the caller imports what `send` returns (`migrate_prefix` does)."""
    if kind not in TRANSPORTS:
        raise ValueError(f"unknown KV transport {kind!r}: choose one of {', '.join(TRANSPORTS)}")
    if kind == "in_process":
        yield InProcessTransport()
        return
    receiver = KVReceiver(on_kv, host) if kind == "tcp" else MooncakeKVReceiver(on_kv, host)
    try:
        yield TcpTransport(receiver.address) if kind == "tcp" else MooncakeTransport(receiver.address, host)
    finally:
        receiver.close()
