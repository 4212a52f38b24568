"""The rollout side of a training run: coordinator, length predictor, engines, sandbox
cluster and rollout worker, wired from one `Config`. Ready groups come out of `ready`;
new weights go in through `push_weights`. The local runtime drives it in-process; the Ray
runtime hosts it in an actor."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from venusrl.config import Config
from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.predictors import BackgroundPredictor, make_predictor
from venusrl.coordinator.snapshot import CoordinatorSnapshot
from venusrl.engine.placement import open_engines
from venusrl.env.registry import environment_factory
from venusrl.model.chat import load_tokenizer
from venusrl.model.checkpoint import resolve_dtype
from venusrl.rollout.worker import RolloutWorker, next_ready
from venusrl.runtime.config import SchedulerPolicy
from venusrl.runtime.evaluation import scored_episodes
from venusrl.sandbox.cluster import LocalCluster
from venusrl.sandbox.errors import SandboxError
from venusrl.trainer.checkpoint import save_rollout_state
from venusrl.types import Group, Priority, Prompt
from venusrl.weights.broadcast import WeightGroup
from venusrl.weights.pusher import WeightPusher

log = logging.getLogger(__name__)

class RolloutService:
    def __init__(
        self,
        config: Config,
        model_dir: Path,
        prompts: Iterable[Prompt],
        weight_version: int = 0,
        snapshot: CoordinatorSnapshot | None = None,
        predictor_path: Path | None = None,
        sandbox_cluster: Any = None,  # in place of a LocalCluster: has .controller and .close(); closed by close()
        engine_handshakes: list[dict[str, Any]] | None = None,  # engine processes already running (Ray actors)
        weight_group: WeightGroup | None = None,  # opened already, for those of `engine_handshakes` that joined it
    ) -> None:
        self.config = config
        policy: SchedulerPolicy = config.scheduler.policy
        sync = config.engine.weight_sync
        group = weight_group
        if group is None and sync.transport == "broadcast" and engine_handshakes is None:
            # a weight group for the engines started here, which pushes reach by broadcast
            group = WeightGroup.open_source(sync.group_host, sync.group_port, config.scheduler.engines,
                                            "nccl" if config.model.device.startswith("cuda") else "gloo",
                                            sync.group_timeout_s)
        self.async_engines = open_engines(model_dir, config.engine, config.model, config.scheduler.engines,
                                          weight_version, engine_handshakes, group)
        self.pusher = WeightPusher(self.async_engines, sync, resolve_dtype(config.model.dtype), group)
        self.tokenizer = load_tokenizer(model_dir)
        self.tokenizer.configure(config.model.chat_template_kwargs, config.model.tool_call_format)
        self.env_factory = environment_factory(config.rollout.environment)
        self.cluster = (sandbox_cluster or LocalCluster(config.sandbox)) if self.env_factory.needs_sandbox else None
        # config.coordinator.policy is derived from the scheduler section (`Config._derive`)
        self.coordinator = (DataCoordinator.restore(config.coordinator, snapshot, prompts) if snapshot is not None
                            else DataCoordinator(config.coordinator, prompts, weight_version=weight_version))
        self.predictor = None
        if policy == "venus":
            predictor_config = config.predictor
            if predictor_path is not None:
                predictor_config = predictor_config.model_copy(update={"path": str(predictor_path)})
            self.predictor = BackgroundPredictor(make_predictor(predictor_config))
        self.ready: asyncio.Queue[Group] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.worker = RolloutWorker(
            self.coordinator, self.async_engines, self.tokenizer, self.env_factory, config.rollout,
            slots=config.scheduler.slots_per_engine, mode=config.scheduler.slot_mode, predictor=self.predictor,
            sandboxes=self.cluster.controller if self.cluster else None, on_ready=self.ready.put_nowait)
        log.info("rollout: %d engine(s) (%s), %s scheduling, environment %s, weight version %d",
                 len(self.async_engines), "given" if engine_handshakes else config.engine.placement, policy,
                 config.rollout.environment, weight_version)

    async def start(self) -> None:
        """Start rolling out; ready groups of a restored snapshot go to the trainer first."""
        for group in self.coordinator.untrained_groups():
            self.ready.put_nowait(group)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.worker.run(stop=self._stop))

    async def next_group(self) -> Group | None:
        """The next ready group, in the order the coordinator retires them; None once the
        dataset is used up and every group has been handed out."""
        return await next_ready(self.ready, self._task)

    async def push_weights(self, weights: dict, version: int) -> dict[str, float]:
        """Every engine takes the weights at an iteration boundary, each by its transport
        (weights/pusher.py; in-flight requests carry on, each token recording its version);
        the coordinator then retires the trained groups and refills the window. The seconds
        each transport took."""
        seconds = await self.pusher.push(weights, version)
        self.worker.on_weight_version(version)
        return seconds

    async def save_state(self, directory: Path) -> None:
        """Coordinator snapshot and predictor into a checkpoint directory. Called right after
        `push_weights`, before another group is taken: the snapshot and the weights
        describe the same moment."""
        snapshot = self.coordinator.snapshot()
        await asyncio.to_thread(save_rollout_state, directory, snapshot, self.predictor)

    async def summary(self) -> dict[str, Any]:
        counts = self.coordinator.counts
        return {"groups_trained": counts.trained, "groups_dropped": counts.dropped,
                "trajectories_discarded": counts.discarded, "preemptions": self.worker.preemptions,
                "migrations": self.worker.migrations,
                "stale_discard_tokens": list(self.coordinator.stale_discard_tokens)}

    async def stats(self) -> dict[str, float]:
        engine_stats = [await engine.stats() for engine in self.async_engines]
        health = [await engine.health() for engine in self.async_engines]
        prompt = sum(s.prompt_tokens for s in engine_stats)
        cached = sum(s.cached_tokens for s in engine_stats)
        stats = {"kv_hit_rate": cached / prompt if prompt else 0.0, "groups_ready": self.coordinator.ready_waiting,
                 "live_trajectories": self.worker.live_trajectories,
                 "engine_live_trajectories": sum(s.live_trajectories for s in engine_stats),
                 "engine_restarts": sum(h.restarts for h in health)}
        if self.cluster is not None:
            stats["sandboxes_live"] = len(self.cluster.controller.routes)
        return stats

    async def sandbox_samples(self) -> list[dict]:
        """Memory per node agent, for the metrics; a node that cannot answer (dead, recovering)
        is left out of this sample rather than stopping the run."""
        if self.cluster is None:
            return []
        try:
            views = await asyncio.to_thread(self.cluster.controller.node_views)
        except SandboxError as err:
            log.info("sandbox sample skipped: %s", err)
            return []
        return [{"node": v.node_id, "memory_bytes": int(v.m_used), "limit_bytes": int(v.m_total), "live": len(v.groups)}
                for v in views]

    async def evaluate(self, prompts: list[Prompt]) -> float:
        """Mean reward of one greedy rollout per held-out prompt on the current weights, at
        HIGH priority (ahead of the rollout's work)."""
        if not prompts:
            return float("nan")
        episodes = await scored_episodes(self.async_engines, self.tokenizer, self.env_factory, self.config.rollout,
                                         prompts, sandboxes=self.cluster.controller if self.cluster else None,
                                         priority=Priority.HIGH)
        return sum(e.scores["graded"] for e in episodes) / len(episodes)

    async def close(self) -> None:
        if self._task is not None:
            self._stop.set()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            for engine in self.async_engines:
                await engine.shutdown()
        finally:  # the weight segment is a model's worth of shared memory: freed whatever failed above
            self.pusher.close()
            if self.predictor is not None:
                self.predictor.close()
            if self.cluster is not None:
                self.cluster.close()
