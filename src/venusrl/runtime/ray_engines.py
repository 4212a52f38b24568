"""Rollout engines as Ray actors (`engine.placement: process` on `run.runtime: ray`): the
actor class, and starting and opening them (at the run's start, and for a lost engine's
replacement: runtime/engine_failover.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import ray

from venusrl.engine.remote.process import EngineServer, EngineSpec, build_engine
from venusrl.runtime.ray_nodes import role_options
from venusrl.runtime.ray_support import ActorProxy, log_to_run, placement
from venusrl.weights.broadcast import GroupSpec


class EngineActor:
    """One rollout engine in its own actor: the engine thread and its wire server
    (`engine/remote/process.py`), reached by the rollout actor's `RemoteEngine` over a socket at this
    node's address, and by other engines' prefix KV over the KV transport."""

    def __init__(self) -> None:
        self.server: EngineServer | None = None

    async def open(self, spec: EngineSpec, run_dir: Path | None = None, log_level: str = "INFO") -> dict[str, Any]:
        """The engine's handshake (`RemoteEngine.from_handshake` reads it)."""
        if run_dir is not None:
            log_to_run(run_dir, log_level, "engine")
        spec = spec.model_copy(update={"host": ray.util.get_node_ip_address()})
        self.server = EngineServer(await asyncio.to_thread(build_engine, spec), spec.host, spec.kv_transport)
        return {**await self.server.start(), **placement()}

    async def join_weight_group(self, spec: GroupSpec) -> dict[str, Any]:
        """Join the rollout actor's weight group (in the background: the first broadcast waits
        for it); the handshake again, now naming this engine's rank."""
        self.server.join_weight_group(spec.model_copy(update={"device_host": ray.util.get_node_ip_address()}))
        return {**self.server.handshake(), **placement()}

    async def close(self) -> None:
        if self.server is not None and not self.server.stopped.is_set():
            await self.server.close()


def start_engine_actors(count: int, gpus: float) -> list[Any]:
    """`count` engine actors, spread over the cluster's nodes, `gpus` GPUs each. They reserve
    no CPU: an engine's compute is its GPU, and on a CPU-only cluster the engines share the
    node's cores as in-process engines share the rollout actor's (placement `in_process`)."""
    options = {"num_cpus": 0, "num_gpus": gpus, "scheduling_strategy": "SPREAD", **role_options("engine")}
    return [ray.remote(EngineActor).options(**options).remote() for _ in range(count)]


async def open_engine_actors(actors: list[Any], spec: Any, run_dir: Path | None = None,
                             log_level: str = "INFO") -> list[dict[str, Any]]:
    """Build each actor's engine (in parallel); their handshakes."""
    proxies = [ActorProxy(actor) for actor in actors]
    return list(await asyncio.gather(*(proxy.open(spec, run_dir, log_level) for proxy in proxies)))
