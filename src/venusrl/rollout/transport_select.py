"""Choosing a KV transport by name: `in_process`, `tcp`, or `mooncake` (Mooncake's transfer
engine, when the `mooncake-transfer-engine` package is installed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from venusrl.engine.kv_pool import HostKV
from venusrl.rollout.kv_transport import (
    InProcessTransport,
    KVReceiver,
    KVTransport,
    OnKV,
    TcpTransport,
)
from venusrl.rollout.mooncake_transport import MooncakeKVReceiver, MooncakeTransport

TRANSPORTS = ("in_process", "tcp", "mooncake")
WIRE_TRANSPORTS = ("tcp", "mooncake")  # the ones that cross processes: what an engine process receives over


def _check(kind: str, choices: tuple[str, ...] = TRANSPORTS) -> None:
    if kind not in choices:
        raise ValueError(f"unknown KV transport {kind!r}: choose one of {', '.join(choices)}")


def open_receiver(kind: str, on_kv: OnKV, host: str = "127.0.0.1") -> KVReceiver:
    """A receiver of `kind` (tcp or mooncake) on `host` handing each delivery to `on_kv`;
    the caller closes it."""
    _check(kind, WIRE_TRANSPORTS)
    return KVReceiver(on_kv, host) if kind == "tcp" else MooncakeKVReceiver(on_kv, host)


def sender(kind: str, address: tuple[str, int], host: str = "127.0.0.1") -> KVTransport:
    """A transport of `kind` to the receiver at `address` (`host`: this side's address)."""
    _check(kind, WIRE_TRANSPORTS)
    return TcpTransport(address) if kind == "tcp" else MooncakeTransport(address, host)


@contextmanager
def open_transport(kind: str, on_kv: Callable[[list[int], HostKV], int],
                   host: str = "127.0.0.1") -> Iterator[KVTransport]:
    """A transport of `kind` to a receiver on `host` that hands each delivery to `on_kv` (the
    receiving engine's import, returning the tokens it took); the receiver closes on exit.
    `in_process` has no receiver: the caller imports what `send` returns (`migrate_prefix` does)."""
    _check(kind)
    if kind == "in_process":
        yield InProcessTransport()
        return
    receiver = open_receiver(kind, lambda token_ids, kv, _trajectory_id: on_kv(token_ids, kv), host)
    try:
        yield sender(kind, receiver.address, host)
    finally:
        receiver.close()
