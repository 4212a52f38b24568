"""Which transport carries a push to one engine: decided from where the engine is, or named
in `engine.weight_sync.transport`. Pure: no torch, no sockets."""

from __future__ import annotations

from dataclasses import dataclass, replace

from venusrl.weights.config import WeightTransport


@dataclass(frozen=True, slots=True)
class EngineLocation:
    """Where an engine is, seen from the pushing process."""

    in_process: bool  # a thread of the pushing process (`AsyncEngine`)
    same_host: bool  # its own process on the pushing process's host
    in_group: bool  # joined the weight group (it can take a broadcast)
    wire: bool = True  # speaks engine/remote/wire.py (an engine process); False: an engine of another backend


def choose_transport(configured: str, location: EngineLocation, weights_on_gpu: bool) -> WeightTransport:
    """The transport for one engine; ValueError naming the field when `configured` cannot
    reach it. An engine of another backend (vLLM) takes its weights by its own `update_weights`
    ("socket" here: the path it has always had)."""
    if not location.wire:
        return "device_copy" if location.in_process else "socket"
    if configured == "auto":
        if location.in_process:
            return "device_copy"
        if location.same_host:
            return "cuda_ipc" if weights_on_gpu else "shared_memory"
        return "broadcast" if location.in_group else "socket"
    reason = _unreachable(configured, location, weights_on_gpu)
    if reason:
        raise ValueError(f"engine.weight_sync.transport: {configured} cannot reach this engine ({reason})")
    return configured  # type: ignore[return-value]


def joins_group(configured: str, location: EngineLocation, weights_on_gpu: bool) -> bool:
    """Whether an engine process started apart from the pushing process (a Ray engine actor)
    is to join the weight group: exactly when, joined, it would take its pushes by broadcast
    (every member must take part in every broadcast, so the group holds those and no more)."""
    return choose_transport(configured, replace(location, in_group=True), weights_on_gpu) == "broadcast"


def _unreachable(transport: str, location: EngineLocation, weights_on_gpu: bool) -> str | None:
    if transport == "device_copy":
        return None if location.in_process else "it runs in another process"
    if location.in_process:
        return "it runs in the pushing process: device_copy or auto"
    if transport in ("shared_memory", "cuda_ipc") and not location.same_host:
        return "it runs on another host"
    if transport == "cuda_ipc" and not weights_on_gpu:
        return "the weights are not on a GPU: shared_memory"
    if transport == "shared_memory" and weights_on_gpu:
        return "the weights are on a GPU: cuda_ipc"
    if transport == "broadcast" and not location.in_group:
        return "it did not join the weight group"
    return None
