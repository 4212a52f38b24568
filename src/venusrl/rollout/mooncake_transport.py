"""Moving prefix KV through Mooncake's transfer engine (the `mooncake-transfer-engine` package).

The KV bytes move through Mooncake; the `KVReceiver` control connection carries only a JSON
header. The receiver pulls: the sender registers its K and V host buffers with its transfer
engine and sends the header (token ids, shape, dtype, its engine's session, the buffers'
addresses); the receiver reads both buffers into tensors it registered, imports them and
replies with the tokens it took. The sender's buffers stay registered, and alive, until that
reply, so a read never touches memory already freed.

Both sides use Mooncake's TCP protocol with peer-to-peer handshakes (no metadata server), so
it runs on loopback and on hosts without RDMA. `mooncake` is imported only when a Mooncake
transport or receiver is made: the rest of venusrl does not need the package.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from venusrl.engine.kv_pool import HostKV
from venusrl.model.checkpoint import resolve_dtype
from venusrl.rollout.kv_transport import KVDelivery, KVReceiver, OnKV, kv_header

log = logging.getLogger(__name__)

INSTALL = "pip install 'venusrl[mooncake]' (on a host without CUDA: pip install mooncake-transfer-engine-non-cuda)"


def _transfer_engine(hostname: str):
    """A started Mooncake transfer engine on `hostname` and its session id ("host:rpc_port"),
    the name peers use to reach its registered memory."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as err:  # absent, or a build whose native libraries this host lacks
        raise ImportError(f"the mooncake KV transport needs the mooncake-transfer-engine package: {INSTALL} ({err})") from err
    engine = TransferEngine()
    status = engine.initialize(hostname, "P2PHANDSHAKE", "tcp", "")
    if status != 0:
        raise RuntimeError(f"Mooncake transfer engine on {hostname} did not start (status {status})")
    return engine, f"{hostname}:{engine.get_rpc_port()}"


@contextmanager
def _registered(engine, tensors: list[torch.Tensor]) -> Iterator[list[int]]:
    """The tensors' addresses, registered with `engine` while the block runs: a Mooncake peer
    serves only addresses inside its registered buffers."""
    addresses, sizes = [t.data_ptr() for t in tensors], [t.nbytes for t in tensors]
    status = engine.batch_register_memory(addresses, sizes)
    if status != 0:
        raise RuntimeError(f"Mooncake could not register {sum(sizes)} bytes of KV (status {status})")
    try:
        yield addresses
    finally:
        engine.batch_unregister_memory(addresses)


class MooncakeKVReceiver(KVReceiver):
    """A `KVReceiver` that reads the KV of each delivery from the sender through Mooncake."""

    def __init__(self, on_kv: OnKV, host: str = "127.0.0.1", port: int = 0):
        self.engine, self.session = _transfer_engine(host)
        super().__init__(on_kv, host, port)

    def receive(self, stream) -> KVDelivery:
        header = json.loads(stream.readline())
        dtype = resolve_dtype(header["dtype"])
        k, v = (torch.empty(header["shape"], dtype=dtype) for _ in range(2))
        start = time.perf_counter()
        with _registered(self.engine, [k, v]) as addresses:
            status = self.engine.batch_transfer_sync_read(
                header["session"], addresses, header["addresses"], [k.nbytes, v.nbytes])
        if status != 0:
            raise ConnectionError(f"Mooncake read of KV from {header['session']} failed (status {status})")
        log.info("KV of %d tokens read over mooncake from %s: %d bytes in %.1f ms", len(header["token_ids"]),
                 header["session"], k.nbytes + v.nbytes, (time.perf_counter() - start) * 1e3)
        return KVDelivery(header["token_ids"], HostKV(k, v), header.get("trajectory_id"))


class MooncakeTransport:
    """Sends KV to the `MooncakeKVReceiver` whose control endpoint is `address`."""

    def __init__(self, address: tuple[str, int], hostname: str = "127.0.0.1", timeout_s: float = 30.0):
        self.address, self.timeout_s = address, timeout_s
        self.engine, self.session = _transfer_engine(hostname)

    def send(self, token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> tuple[list[int], HostKV]:
        if kv.num_tokens == 0:  # nothing to register or read; the receiver would take nothing
            return [], kv
        start = time.perf_counter()
        tensors = [kv.k.contiguous(), kv.v.contiguous()]
        with _registered(self.engine, tensors) as addresses, \
                socket.create_connection(self.address, timeout=self.timeout_s) as connection:
            header = {**kv_header(token_ids, kv, trajectory_id), "session": self.session, "addresses": addresses}
            connection.sendall((json.dumps(header) + "\n").encode())
            reply = connection.makefile("rb").readline()
        if not reply:
            raise ConnectionError(f"KV receiver at {self.address} closed without a reply (its log says why)")
        imported = json.loads(reply)["imported"]
        log.info("KV of %d tokens sent over mooncake to %s: %d bytes in %.1f ms, %d tokens imported", len(token_ids),
                 self.address, sum(t.nbytes for t in tensors), (time.perf_counter() - start) * 1e3, imported)
        return list(token_ids[:imported]), kv
