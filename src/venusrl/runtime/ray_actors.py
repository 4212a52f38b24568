"""The Ray runtime's actors: the rollout side and the trainer side of a run, each the
local runtime's service in its own process (the engine actors: ray_engines.py). Both are
async actors: their methods are the services' coroutines, run on the actor's event loop
(the rollout worker is a task there)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import ray
import torch

from venusrl.config import Config
from venusrl.coordinator.snapshot import CoordinatorSnapshot
from venusrl.engine.placement import engine_spec
from venusrl.engine.remote.remote import RemoteEngine
from venusrl.env.registry import environment_factory
from venusrl.runtime.data import prompt_stream
from venusrl.runtime.ray_engines import open_engine_actors, start_engine_actors
from venusrl.runtime.ray_sandbox import RayCluster
from venusrl.runtime.ray_support import log_to_run, placement
from venusrl.runtime.rollout_service import RolloutService
from venusrl.runtime.trainer_service import TrainerService
from venusrl.types import Prompt
from venusrl.weights.broadcast import GroupSpec, WeightGroup
from venusrl.weights.placement import joins_group
from venusrl.weights.pusher import locate


class RolloutActor(RolloutService):
    """Built by `open`, not `__init__`: Ray reports an error raised in `__init__` as a bare
    ActorDiedError, one raised in a method as the exception itself (a bad model directory
    is then a ValueError, as on the local runtime)."""

    def __init__(self) -> None:
        self.opened = False
        self.weight_group: WeightGroup | None = None

    async def open_weight_group(self, config: Config, handshakes: list[dict[str, Any]]) -> dict[int, GroupSpec]:
        """Before `open`: the weight group of the engine actors that are to take pushes by
        broadcast (`joins_group`: with `auto`, those on another node than this actor), rank 0
        here; each joining engine's spec by its index in `handshakes`. The rendezvous listens,
        and gloo's transport binds, at this node's IP as Ray reports it (the other nodes reach
        it there, whatever this host's name resolves to). Over gloo: this actor pushes the
        object store's host copy of the trainer's weights."""
        sync = config.engine.weight_sync
        joining = [i for i, handshake in enumerate(handshakes)
                   if joins_group(sync.transport, locate(RemoteEngine.from_handshake(handshake)), weights_on_gpu=False)]
        if not joining:
            return {}
        node = ray.util.get_node_ip_address()
        self.weight_group = WeightGroup.open_source(node, sync.group_port, len(joining), "gloo", sync.group_timeout_s,
                                                    device_host=node)
        return {index: self.weight_group.member(rank) for rank, index in enumerate(joining, start=1)}

    async def open(self, config: Config, run_dir: Path, model_dir: Path, train_prompts: list[Prompt], skip: int,
                   weight_version: int, snapshot: CoordinatorSnapshot | None,
                   predictor_path: Path | None, engine_handshakes: list[dict[str, Any]] | None = None,
                   engine_gpus: float = 0.0) -> dict[str, Any]:
        """`engine_gpus`: each engine actor's, for a lost one's replacement."""
        log_to_run(run_dir, config.run.log_level, "rollout")
        self.replacement = (engine_spec(model_dir, config.engine, config.model), engine_gpus, run_dir)
        self.replacement_actors: list[Any] = []
        cluster = RayCluster(config.sandbox) if environment_factory(config.rollout.environment).needs_sandbox else None
        try:
            super().__init__(config, model_dir, prompt_stream(train_prompts, config.trainer.epochs, skip),
                             weight_version, snapshot, predictor_path, sandbox_cluster=cluster,
                             engine_handshakes=engine_handshakes, weight_group=self.weight_group,
                             replace_engine=self._replacement_engine if engine_handshakes else None)
        except BaseException:
            if cluster is not None:
                cluster.close()
            raise
        self.opened = True
        return placement()

    async def _replacement_engine(self, index: int) -> RemoteEngine:
        """A new engine actor for lost engine `index`, on a node with room for one (an engine
        node's `venusrl_engine` unit: the lost node once it is back, or a new node); this
        waits until Ray can place it. It starts from the base model: the failover admits it
        after the next weight push. Owned by this actor, it ends with it."""
        spec, gpus, run_dir = self.replacement
        (actor,) = start_engine_actors(1, gpus)
        self.replacement_actors.append(actor)  # Ray ends an actor once no handle to it is left
        (handshake,) = await open_engine_actors([actor], spec, run_dir, self.config.run.log_level)
        return RemoteEngine.from_handshake(handshake, name=f"engine {index} ({handshake['address'][0]}, "
                                                           f"pid {handshake['pid']})")

    async def close(self) -> None:
        if self.opened:
            await super().close()


class TrainerActor(TrainerService):
    """Built by `open`, for the reason RolloutActor is."""

    def __init__(self) -> None:
        pass

    async def open(self, config: Config, run_dir: Path, model_dir: Path, weight_version: int,
                   optimizer_state: Path | None) -> dict[str, Any]:
        log_to_run(run_dir, config.run.log_level, "trainer")
        super().__init__(config, model_dir, weight_version, optimizer_state)
        return placement()

    async def weights(self) -> dict[str, torch.Tensor]:
        """A host copy: the result goes into the object store after this returns, while the
        trainer may step again, and the rollout actor may have no GPU."""
        return await asyncio.to_thread(self.trainer.engine_weights)
