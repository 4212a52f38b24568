"""The rollout side of a training run: coordinator, length predictor, engines, sandbox
cluster and rollout worker, wired from one `Config`. Ready groups come out of `ready`;
new weights go in through `push_weights`. The local runtime drives it in-process; the Ray
runtime hosts it in an actor.

The worker reaches the engines through an `EngineFailover` (engine_failover.py): a lost
engine's turns resume on the others; weight pushes, stats and shutdown go to the live
engines only. Once no engine is left, `next_group` raises `AllEnginesLost`."""

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
from venusrl.engine.async_engine import EngineStopped
from venusrl.engine.placement import open_engines
from venusrl.engine.stats import summed_memory_stalls
from venusrl.env.registry import environment_factory
from venusrl.model.chat import load_tokenizer
from venusrl.model.checkpoint import resolve_dtype
from venusrl.rollout.worker import RolloutWorker, next_ready
from venusrl.runtime.config import SchedulerPolicy
from venusrl.runtime.engine_failover import AllEnginesLost, EngineFailover, Replace
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
        replace_engine: Replace | None = None,  # starts a lost engine's replacement (engine_failover.py)
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
        # a broadcast weight group cannot take a new member: there a lost engine stays lost
        self.failover = EngineFailover(self.async_engines, replace=replace_engine if group is None else None)
        self.weight_group = group
        self.pusher = WeightPusher(self.async_engines, sync, resolve_dtype(config.model.dtype), group)
        self._pushing_to = self.failover.live()
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
            self.coordinator, self.failover.clients, self.tokenizer, self.env_factory, config.rollout,
            slots=config.scheduler.slots_per_engine, mode=config.scheduler.slot_mode, predictor=self.predictor,
            sandboxes=self.cluster.controller if self.cluster else None, on_ready=self.ready.put_nowait,
            live_set=config.scheduler.live_set_rule, live_set_interval_s=config.scheduler.live_set_interval_s,
            live_set_buffer_tokens=config.scheduler.live_set_buffer_tokens, acting_decay=config.scheduler.acting_token_decay,
            live_set_thrash_fraction=config.scheduler.live_set_thrash_fraction)
        log.info("rollout: %d engine(s) (%s), %s scheduling, environment %s, weight version %d",
                 len(self.async_engines), "given" if engine_handshakes else config.engine.placement, policy,
                 config.rollout.environment, weight_version)

    async def start(self) -> None:
        """Start rolling out; ready groups of a restored snapshot go to the trainer first."""
        for group in self.coordinator.untrained_groups():
            self.ready.put_nowait(group)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run_worker())
        self._watch = asyncio.create_task(self.failover.watch())

    async def _run_worker(self) -> None:
        """The worker, until it ends or the last engine is lost (then it stops and this raises)."""
        worker = asyncio.create_task(self.worker.run(stop=self._stop))
        all_lost = asyncio.create_task(self.failover.all_lost.wait())
        await asyncio.wait([worker, all_lost], return_when=asyncio.FIRST_COMPLETED)
        all_lost.cancel()
        if self.failover.all_lost.is_set():
            self._stop.set()
            await asyncio.gather(worker, return_exceptions=True)
            raise AllEnginesLost(f"every engine is lost ({self.failover.stats()})")
        worker.result()

    async def next_group(self) -> Group | None:
        """The next ready group, in the order the coordinator retires them; None once the
        dataset is used up and every group has been handed out."""
        return await next_ready(self.ready, self._task)

    async def push_weights(self, weights: dict, version: int) -> dict[str, float]:
        """Every engine takes the weights at an iteration boundary, each by its transport
        (weights/pusher.py; in-flight requests carry on, each token recording its version);
        the coordinator then retires the trained groups and refills the window. The seconds
        each transport took. Lost engines are left out; a lost engine's replacement takes
        its first push here and is admitted (engine_failover.py)."""
        targets = self._push_targets()
        try:
            seconds = await self._push(weights, version, targets)
        except EngineStopped as err:  # an engine went during the push: once more to those still behind
            for index in self.failover.live():
                await self.failover.check(index, err)
            for index, engine in list(self.failover.pending.items()):
                if not await self.failover.answers(engine):
                    await _shutdown_quietly(self.failover.drop_pending(index, str(err)))
            targets = self._push_targets()
            behind = [i for i in targets if (await self._engine(i).health()).weight_version < version]
            seconds = await self._push(weights, version, behind) if behind else {}
        for index in targets:  # replacements this push reached now hold the current weights
            if index in self.failover.pending:
                self.failover.admit(index)
        self.worker.on_weight_version(version)
        return seconds

    def _push_targets(self) -> list[int]:
        """The live engines and the replacements waiting for their first push."""
        return sorted([*self.failover.live(), *self.failover.pending])

    def _engine(self, index: int) -> Any:
        return self.failover.pending.get(index) or self.async_engines[index]

    async def _push(self, weights: dict, version: int, targets: list[int]) -> dict[str, float]:
        """A push to `targets`, through a pusher over those (a new one when they changed)."""
        if targets != self._pushing_to:
            if self.weight_group is not None:
                raise AllEnginesLost(f"engine(s) {sorted(set(self._pushing_to) - set(targets))} lost: the broadcast "
                                     "weight group cannot lose a member; the run stops (it resumes from its last "
                                     "checkpoint)")
            self.pusher.close()
            self.pusher = WeightPusher([self._engine(i) for i in targets], self.config.engine.weight_sync,
                                       resolve_dtype(self.config.model.dtype))
            self._pushing_to = targets
        return await self.pusher.push(weights, version)

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
        engine_stats, health, prompts_by_engine = [], [], {}
        for index in self.failover.live():
            engine = self.async_engines[index]
            try:
                engine_stats.append(await engine.stats())
                prompts_by_engine[str(index)] = engine_stats[-1].prompt_tokens
                health.append(await engine.health())
            except EngineStopped as err:  # lost (then left out from now on), or back for the next sample
                await self.failover.check(index, err)
        prompt = sum(s.prompt_tokens for s in engine_stats)
        cached = sum(s.cached_tokens for s in engine_stats)
        stats = {"kv_hit_rate": cached / prompt if prompt else 0.0, "groups_ready": self.coordinator.ready_waiting,
                 "trajectories_discarded": self.coordinator.counts.discarded,
                 "live_trajectories": self.worker.live_trajectories,
                 # moves decided, by reason, those that did not land, and the readings that found the
                 # pool with room (`RolloutWorker.move_figures`)
                 **self.worker.move_figures(),
                 "engine_live_trajectories": sum(s.live_trajectories for s in engine_stats),
                 "engine_restarts": sum(h.restarts for h in health), **self.failover.stats(),
                 # iterations whose admission stopped for memory, by the priority it stopped at
                 "engine_memory_stalls": summed_memory_stalls(engine_stats),
                 # per live engine (a replacement's count starts at 0): the load each took
                 "engine_prompt_tokens": prompts_by_engine}
        if self.cluster is not None:
            controller = self.cluster.controller
            stats["sandboxes_live"] = len(controller.routes)
            stats["sandbox_nodes_lost"] = sum(not alive for alive in controller.alive.values())
            stats["sandboxes_recovered"] = len(controller.recoveries)
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
        episodes = await scored_episodes(self.failover.clients, self.tokenizer, self.env_factory, self.config.rollout,
                                         prompts, sandboxes=self.cluster.controller if self.cluster else None,
                                         priority=Priority.HIGH)
        return sum(e.scores["graded"] for e in episodes) / len(episodes)

    async def close(self) -> None:
        self.failover.closing = True
        self.failover.stop_replacing()
        for engine in self.failover.pending.values():  # started, never admitted
            await _shutdown_quietly(engine)
        if self._task is not None:
            self._stop.set()
            self._watch.cancel()
            await asyncio.gather(self._task, self._watch, return_exceptions=True)
        try:
            for index in self.failover.live():  # a lost engine's actor or process is ended by its owner
                await self.async_engines[index].shutdown()
        finally:  # the weight segment is a model's worth of shared memory: freed whatever failed above
            self.pusher.close()
            if self.predictor is not None:
                self.predictor.close()
            if self.cluster is not None:
                self.cluster.close()


async def _shutdown_quietly(engine: Any) -> None:
    """A replacement engine that never served: its shutdown failing (it is gone) changes nothing."""
    try:
        await engine.shutdown()
    except Exception as err:
        log.info("replacement engine shutdown failed: %s", err)
