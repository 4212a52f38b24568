"""Weights to engines on other hosts: one broadcast over a torch.distributed group whose
rank 0 is the pushing process and whose ranks 1..N are the engine processes (NCCL when the
weights are on GPUs, gloo on the CPU).

Rendezvous, at start-up: the pushing process opens a TCPStore at
`engine.weight_sync.group_host:group_port` (port 0: a free one) before it starts the
engines; each engine's `EngineSpec.weight_group` names that address, its rank and the world
size, and the engine process joins in the background once it has handshaken (so no side
waits on the other to start). The group is its own process group (not the default one), so
an FSDP trainer in the same process keeps its own.

A push: the pushing process sends each engine the layout, the size and the version over its
socket, then broadcasts the packed buffer; each engine receives the whole buffer before it
checks anything (every rank must take part in every broadcast, or the group hangs), then
copies it in or refuses it as a whole. `WeightPusher` holds one push at a time.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)
STORE_PREFIX = "venusrl-weights"


class GroupSpec(BaseModel):
    """One member's view of the weight group (an engine's is in its `EngineSpec`)."""

    host: str
    port: int = Field(ge=1, le=65535)
    rank: int = Field(ge=0)
    world_size: int = Field(ge=2)
    backend: str = Field("gloo", pattern="^(gloo|nccl)$")
    timeout_s: float = Field(600.0, gt=0)
    device_host: str | None = Field(
        None, description="gloo: the address this member's transport binds and the others connect to (a Ray "
        "actor's: its node's IP, as Ray reports it); None: the one its hostname resolves to, which on hosts "
        "that map their name to a loopback address reaches no other host")


class WeightGroup:
    """This process's membership of the weight group; `join` runs in the background, and the
    first broadcast waits for it."""

    def __init__(self, spec: GroupSpec, store: dist.TCPStore | None = None) -> None:
        self.spec = spec
        self._store = store
        self._group: dist.ProcessGroup | None = None
        self._error: BaseException | None = None
        self._joined = threading.Event()
        self._buffer: torch.Tensor | None = None
        threading.Thread(target=self._join, name="venusrl-weight-group", daemon=True).start()

    @classmethod
    def open_source(cls, host: str, port: int, engines: int, backend: str, timeout_s: float,
                    device_host: str | None = None) -> WeightGroup:
        """Rank 0: the rendezvous store (listening now, so the engines can be started next)."""
        store = dist.TCPStore(host, port, engines + 1, True, timeout=timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        spec = GroupSpec(host=host, port=store.port, rank=0, world_size=engines + 1, backend=backend,
                         timeout_s=timeout_s, device_host=device_host)
        log.info("weight group: rendezvous at %s:%d for %d engine(s), %s", host, store.port, engines, backend)
        return cls(spec, store)

    def member(self, rank: int) -> GroupSpec:
        """The spec engine `rank` (1..N) joins with (its `device_host` its own to set)."""
        return self.spec.model_copy(update={"rank": rank, "device_host": None})

    def _join(self) -> None:
        spec = self.spec
        timeout = timedelta(seconds=spec.timeout_s)
        try:
            store = self._store or dist.TCPStore(spec.host, spec.port, spec.world_size, False, timeout=timeout)
            prefixed = dist.PrefixStore(STORE_PREFIX, store)
            if spec.backend == "nccl":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                options.group_name = STORE_PREFIX
                self._group = dist.ProcessGroupNCCL(prefixed, spec.rank, spec.world_size, options)
            else:
                options = dist.ProcessGroupGloo._Options()
                options._timeout = timeout
                options._devices = [dist.ProcessGroupGloo.create_device(hostname=spec.device_host) if spec.device_host
                                    else dist.ProcessGroupGloo.create_default_device()]
                self._group = dist.ProcessGroupGloo(prefixed, spec.rank, spec.world_size, options)
            self._store = store
            log.info("weight group: joined as rank %d of %d (%s)", spec.rank, spec.world_size, spec.backend)
        except BaseException as err:  # reported by the first broadcast
            self._error = err
        finally:
            self._joined.set()

    def _ready(self) -> dist.ProcessGroup:
        if not self._joined.wait(self.spec.timeout_s):
            raise TimeoutError(f"weight group: rank {self.spec.rank} not joined within {self.spec.timeout_s:.0f} s")
        if self._error is not None:
            raise RuntimeError(f"weight group: rank {self.spec.rank} could not join: {self._error}") from self._error
        return self._group

    def send(self, buffer: torch.Tensor) -> None:
        """Rank 0: broadcast `buffer` (blocks until every rank has it)."""
        self._broadcast(buffer)

    def receive(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """Ranks 1..N: the next broadcast buffer (`nbytes`, reused across pushes): on `device`
        over NCCL; on the host over gloo, whose source may be a host copy (a Ray run pushes
        from the object store's) and which moves host memory anyway: the engine copies the
        views into its parameters, on its device."""
        if self.spec.backend == "gloo":
            device = torch.device("cpu")
        if self._buffer is None or self._buffer.numel() != nbytes or self._buffer.device != device:
            self._buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self._broadcast(self._buffer)
        return self._buffer

    def _broadcast(self, buffer: torch.Tensor) -> None:
        group = self._ready()
        options = dist.BroadcastOptions()
        options.rootRank = 0
        group.broadcast([buffer], options).wait()
        if buffer.is_cuda:
            torch.cuda.current_stream(buffer.device).synchronize()
