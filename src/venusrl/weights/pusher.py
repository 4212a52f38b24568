"""`WeightPusher`: one version of the trainer's weights to every engine, each by the
transport its place calls for (weights/placement.py), every push whole or not at all.

    device_copy    engine in this process: `update_weights` with the trainer's own tensors;
                   the engine copies them into its parameters, cast on its device (no host
                   round trip when both are on one GPU)
    shared_memory  engine process, same host, weights on the CPU: written once into a
                   segment all of them map (weights/shared_memory.py)
    cuda_ipc       engine process, same host, weights on a GPU: packed once into a device
                   buffer whose IPC handle they open (weights/cuda_ipc.py)
    broadcast      engine process on another host, in the weight group (weights/broadcast.py)
    socket         the tensors' bytes over the engine's socket (`RemoteEngine.update_weights`)

The weights may be the trainer's live parameters: every transport has read them by the time
`push` returns (in-process engines copy during their call; the others pack before sending),
so the trainer must not step during a push, and does not: the driver awaits it.

Invariant: one version per push; each engine either applies all of a push or keeps its old
weights and version (`Engine.update_weights`). An engine that missed a push (refused it, or
was unreachable) serves the version it has, whole; the next push carries every tensor, so
it catches up. One push at a time: the shared buffers are rewritten only after every engine
answered the previous push.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import defaultdict

import torch

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.client import EngineClient
from venusrl.engine.remote.remote import RemoteEngine
from venusrl.weights.broadcast import WeightGroup
from venusrl.weights.config import WeightSyncConfig, WeightTransport
from venusrl.weights.cuda_ipc import CudaIpcWriter
from venusrl.weights.layout import WeightLayout
from venusrl.weights.placement import EngineLocation, choose_transport
from venusrl.weights.shared_memory import SharedMemoryWriter

log = logging.getLogger(__name__)


def locate(engine: EngineClient) -> EngineLocation:
    if isinstance(engine, AsyncEngine):
        return EngineLocation(in_process=True, same_host=True, in_group=False)
    if isinstance(engine, RemoteEngine):
        return EngineLocation(in_process=False, same_host=engine.hostname == socket.gethostname(),
                              in_group=engine.weight_rank is not None)
    return EngineLocation(in_process=False, same_host=False, in_group=False, wire=False)


class WeightPusher:
    def __init__(self, engines: list[EngineClient], config: WeightSyncConfig, dtype: torch.dtype,
                 group: WeightGroup | None = None) -> None:
        """`dtype`: the engines' (what the handle transports pack floating tensors in)."""
        self.engines, self.config, self.dtype, self.group = engines, config, dtype, group
        self.locations = [locate(engine) for engine in engines]
        for location in self.locations:  # a transport that cannot reach an engine fails now, not at a push
            choose_transport(config.transport, location, weights_on_gpu=config.transport == "cuda_ipc")
        self._shared = SharedMemoryWriter()
        self._ipc = CudaIpcWriter()
        self._broadcast_buffer: torch.Tensor | None = None  # kept across pushes, as the others' buffers
        self._lock = asyncio.Lock()

    def routes(self, weights_on_gpu: bool) -> dict[WeightTransport, list[int]]:
        """Engine indices by the transport each gets a push over."""
        routes: dict[WeightTransport, list[int]] = defaultdict(list)
        for index, location in enumerate(self.locations):
            routes[choose_transport(self.config.transport, location, weights_on_gpu)].append(index)
        return dict(routes)

    async def push(self, weights: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        """Every engine at `version`, or the first error (naming the engine) once every engine
        has answered; the seconds each transport took (the metrics' weight push times)."""
        async with self._lock:
            device = next(iter(weights.values())).device
            routes = self.routes(device.type == "cuda")
            seconds: dict[str, float] = {}

            async def timed(transport: str, pushing) -> None:
                started = time.perf_counter()
                try:
                    await pushing
                finally:
                    seconds[transport] = round(time.perf_counter() - started, 4)

            jobs = [timed(transport, self._push(transport, [self.engines[i] for i in indices], weights, version,
                                                device))
                    for transport, indices in routes.items()]
            results = await asyncio.gather(*jobs, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                # an engine whose call failed on this side may still be copying from this push's
                # buffers: the next push writes fresh ones rather than rewrite them under it
                self.close()
                raise errors[0]
            log.info("weights version %d pushed to %d engine(s): %s", version, len(self.engines),
                     ", ".join(f"{t} {s:.3f} s" for t, s in seconds.items()))
            return seconds

    async def _push(self, transport: str, engines: list[EngineClient], weights: dict[str, torch.Tensor],
                    version: int, device: torch.device) -> None:
        if transport == "device_copy":  # the engine casts on its device
            await _all(engines, [engine.update_weights(weights, version) for engine in engines])
            return
        if transport == "socket":  # the bytes in the engines' dtype, not the trainer's (fp32 masters)
            cast = await asyncio.to_thread(_in_dtype, weights, self.dtype)
            await _all(engines, [engine.update_weights(cast, version) for engine in engines])
            return
        layout = WeightLayout.of(weights, self.dtype)
        if transport == "shared_memory":
            fields = await asyncio.to_thread(self._shared.write, weights, layout, version)
            await _all(engines, [engine.update_weights_by("shared", version, layout, fields) for engine in engines])
        elif transport == "cuda_ipc":
            fields = await asyncio.to_thread(self._ipc.write, weights, layout, device)
            await _all(engines, [engine.update_weights_by("cuda_ipc", version, layout, fields) for engine in engines])
        else:
            if self.group is None or len(engines) != self.group.spec.world_size - 1:
                raise ValueError("engine.weight_sync: a broadcast needs every engine of the weight group")
            buffer = self._broadcast_buffer
            if buffer is None or buffer.numel() != layout.nbytes or buffer.device != device:
                buffer = self._broadcast_buffer = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
            await asyncio.to_thread(layout.pack, weights, buffer)
            answers = [engine.update_weights_by("broadcast", version, layout, {"nbytes": layout.nbytes})
                       for engine in engines]  # sent before the broadcast: each engine then joins it
            tasks = [asyncio.ensure_future(answer) for answer in answers]
            sent = asyncio.to_thread(self.group.send, buffer)
            await _all([None, *engines], [sent, *tasks])

    def close(self) -> None:
        self._shared.close()
        self._ipc.close()
        self._broadcast_buffer = None


def _in_dtype(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {name: t.to(dtype) if t.is_floating_point() else t for name, t in weights.items()}


async def _all(engines: list, calls: list) -> None:
    """Wait for every call (a failed one must not leave others running when the buffers are
    next rewritten); then raise the first failure, naming its engine."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for engine, result in zip(engines, results, strict=True):
        if isinstance(result, BaseException):
            name = getattr(engine, "name", type(engine).__name__) if engine is not None else "the weight group"
            raise type(result)(f"{name}: weight push refused: {result}") if isinstance(result, ValueError) else result
