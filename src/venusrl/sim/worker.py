"""The simulated rollout worker: the real coordinator's trajectories as agent loops on the
simulated engines, scheduled per action with the real `SlotScheduler` and, across engines,
the real `choose_moves`. It mirrors `venusrl.rollout.worker.RolloutWorker` event for event
(turn start, prediction, slot grant, preemption, turn end, tool call, done, discard, policy
change, moves between engines) with the event loop in place of asyncio.

Lengths are in units of `quantum` real tokens: a trajectory's context is a list of unit ids
(its group's prompt ids, then its own generated and observation ids).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.decisions import Decisions, PriorityPolicy
from venusrl.engine.request import PartialOutput
from venusrl.rollout.orchestrator import choose_moves
from venusrl.rollout.slots import SlotScheduler, steal_candidate
from venusrl.sim.engine import SimEngine
from venusrl.sim.events import Event, EventLoop
from venusrl.sim.predictor import NoisyLengthPredictor
from venusrl.sim.systems import SystemSpec
from venusrl.sim.workload import TrajectoryPlan
from venusrl.types import Group, Priority, Trajectory

log = logging.getLogger(__name__)


class Phase(Enum):
    WAITING_SLOT = "waiting_slot"
    GENERATING = "generating"
    IN_TOOL = "in_tool"
    MOVING = "moving"  # migrating to another engine with its prefix KV
    DONE = "done"


@dataclass(slots=True, eq=False)
class SimTrajectory:
    id: int
    key: str  # the engine's trajectory id
    group_id: int
    gen_units: tuple[int, ...]  # per turn
    obs_units: tuple[int, ...]
    tool_seconds: tuple[float, ...]
    engine: int
    token_ids: list[int]
    turn: int = 0
    into_turn: int = 0  # units of the current turn generated so far (across preemptions)
    generated: int = 0  # units generated in finished turns
    requests: int = 0
    request_id: str | None = None
    phase: Phase = Phase.WAITING_SLOT
    pending: Event | None = None  # the tool call or migration under way

    @property
    def remaining_units(self) -> int:
        return sum(self.gen_units[self.turn :]) - self.into_turn


class LeastLoaded:
    """The engine with the fewest live trajectories in O(log E): a heap with lazy entries."""

    def __init__(self, engines: int) -> None:
        self.loads = [0] * engines
        self._heap = [(0, i) for i in range(engines)]

    def take(self) -> int:
        while True:
            load, index = self._heap[0]
            if load == self.loads[index]:
                self.add(index, 1)
                return index
            heapq.heappop(self._heap)

    def add(self, index: int, delta: int) -> None:
        self.loads[index] += delta
        heapq.heappush(self._heap, (self.loads[index], index))


@dataclass(slots=True)
class WorkerCounts:
    turns: int = 0
    preemptions: int = 0
    migrations: int = 0
    migrated_units: int = 0
    predictions: int = 0
    discarded: int = 0
    finished: int = 0


@dataclass(slots=True)
class SimWorker:
    loop: EventLoop
    coordinator: DataCoordinator
    engines: list[SimEngine]
    system: SystemSpec
    slots_per_engine: int
    plan_of: Callable[[Trajectory], TrajectoryPlan]
    prompt_ids_of: Callable[[Trajectory], list[int]]  # shared by the group: its prefix
    token_ids: itertools.count
    quantum: int
    on_ready: Callable[[Group], None]
    predictor: NoisyLengthPredictor | None = None
    orchestration_interval_s: float = 5.0
    orchestration_threshold: float = 0.9
    transfer_s_per_unit: float = 0.0  # host-to-host copy of one unit of prefix KV
    counts: WorkerCounts = field(default_factory=WorkerCounts)
    live: dict[int, SimTrajectory] = field(default_factory=dict)
    slots: list[SlotScheduler] = field(init=False)
    _by_request: dict[str, SimTrajectory] = field(default_factory=dict)
    _policy: PriorityPolicy = field(default_factory=lambda: PriorityPolicy(0, frozenset(), frozenset()))
    _placement: LeastLoaded = field(init=False)

    def __post_init__(self) -> None:
        self.slots = [SlotScheduler(self.slots_per_engine, self.system.slot_mode, self.coordinator.critical_order)
                      for _ in self.engines]
        self._placement = LeastLoaded(len(self.engines))
        for engine in self.engines:
            engine.on_finished = self._on_request_finished

    def start(self) -> None:
        self._apply(self.coordinator.start(self.loop.now))
        if self.system.orchestration and len(self.engines) > 1:
            self.loop.after(self.orchestration_interval_s, self._orchestrate)

    # ---- coordinator decisions -------------------------------------------------------------

    def _apply(self, decisions: Decisions) -> None:
        for trajectory in decisions.start:
            self._start(trajectory)
        for trajectory_id in decisions.discarded:
            self._discard(trajectory_id)
        for group in decisions.ready:
            self.on_ready(group)
        if decisions.policy is not None and self.system.slot_mode == "priority" and not self.system.program_aware:
            self._repriorise(decisions.policy)

    def _repriorise(self, policy: PriorityPolicy) -> None:
        """Only trajectories whose group or promotion changed: O(change), not O(live)."""
        old, self._policy = self._policy, policy
        for trajectory_id in self.coordinator.touched_by(policy, old):
            trajectory = self.live.get(trajectory_id)
            if trajectory is None:
                continue
            self.slots[trajectory.engine].set_priority(trajectory_id, self._slot_priority(trajectory))
            self.engines[trajectory.engine].set_priority(trajectory.key, self._declared_priority(trajectory))

    def _declared_priority(self, trajectory: SimTrajectory) -> Priority:
        """What the engine is told: the coordinator's priority, HIGH for every program under
        program-aware scheduling, LOW where slots ignore priority."""
        if self.system.program_aware:
            return Priority.HIGH
        if self.system.slot_mode != "priority":
            return Priority.LOW
        return self.coordinator.policy.priority(trajectory.group_id, trajectory.id)

    def _slot_priority(self, trajectory: SimTrajectory) -> Priority:
        """The declared priority, but LOW while the engine has demoted (paused) the
        trajectory: it cannot get KV then, so it must not keep a slot from one that can."""
        if self.system.demotion and self.engines[trajectory.engine].paused(trajectory.key):
            return Priority.LOW
        return self._declared_priority(trajectory)

    # ---- one trajectory --------------------------------------------------------------------

    def _start(self, trajectory: Trajectory) -> None:
        plan = self.plan_of(trajectory)
        q = self.quantum
        turns = plan.turns
        gen = tuple(max(1, round(t.gen_tokens / q)) for t in turns)
        obs = tuple(round(t.obs_tokens / q) for t in turns)
        sim = SimTrajectory(
            id=trajectory.id, key=str(trajectory.id), group_id=trajectory.group_id,
            gen_units=gen, obs_units=obs, tool_seconds=tuple(t.tool_seconds for t in turns),
            engine=self._placement.take(), token_ids=list(self.prompt_ids_of(trajectory)),
        )  # fmt: skip
        self.live[sim.id] = sim
        self._turn_start(sim, list(sim.token_ids))

    def _turn_start(self, t: SimTrajectory, context_ids: list[int]) -> None:
        self._apply(self.coordinator.on_turn_start(t.id, self.loop.now, context_ids))
        if t.phase is Phase.DONE:
            return
        if self.predictor is not None and self.system.uses_predictions:
            predicted = self.predictor.predict(t.remaining_units)
            at = t.generated
            self.loop.after(self.predictor.latency_s, lambda: self._predicted(t, predicted, at))
        self._request_slot(t)

    def _predicted(self, t: SimTrajectory, remaining: float, at_generated: int) -> None:
        if t.phase is Phase.DONE:
            return
        self.counts.predictions += 1
        self._apply(self.coordinator.on_prediction(t.id, self.loop.now, remaining, at_generated))

    def _request_slot(self, t: SimTrajectory) -> None:
        t.phase = Phase.WAITING_SLOT
        slots = self.slots[t.engine]
        if self.system.demotion and self.system.slot_mode == "priority" and len(slots.holders) >= slots.slots:
            for other in itertools.chain(slots.holders, slots.waiting):  # demotions change per iteration
                slots.set_priority(other, self._slot_priority(self.live[other]))
        granted, victim = slots.request(t.id, self._slot_priority(t))
        if victim is not None:
            self._preempt(self.live[victim])
        if granted:
            self._submit(t)
        elif self.system.orchestration:  # queued here while an engine idles: move there
            for other in range(len(self.slots)):
                self._steal_for(other)

    def _submit(self, t: SimTrajectory) -> None:
        remaining = t.gen_units[t.turn] - t.into_turn
        room = self.engines[t.engine].scheduler.allocator.capacity_tokens - 1 - len(t.token_ids)
        if remaining <= 0 or room <= 0:  # preempted after its last unit, or the pool is full
            self._turn_end(t)
            return
        t.phase = Phase.GENERATING
        t.requests += 1
        t.request_id = f"{t.key}.{t.requests}"
        self._by_request[t.request_id] = t
        self.engines[t.engine].add_request(t.request_id, t.token_ids, remaining, self._declared_priority(t), t.key)

    def _preempt(self, t: SimTrajectory) -> None:
        """A HIGH turn took the slot of this LOW one: abort its request, keep its tokens; it
        waits for a slot again (the slot scheduler queued it)."""
        if t.request_id is None:
            return
        partial = self.engines[t.engine].abort(t.request_id)
        self._take_output(t, partial)
        t.phase = Phase.WAITING_SLOT
        self.counts.preemptions += 1

    def _take_output(self, t: SimTrajectory, output: PartialOutput) -> None:
        del self._by_request[output.request_id]
        t.request_id = None
        t.token_ids.extend(output.output_ids)
        t.into_turn += len(output.output_ids)

    def _on_request_finished(self, engine: int, output: PartialOutput) -> None:
        t = self._by_request.get(output.request_id)
        if t is None:
            return
        self._take_output(t, output)
        self._turn_end(t)

    def _turn_end(self, t: SimTrajectory) -> None:
        self._release_slot(t, finished=False)
        units = t.into_turn
        turn_ids = t.token_ids[len(t.token_ids) - units :]
        last = t.turn == len(t.gen_units) - 1
        tool = t.tool_seconds[t.turn]
        t.generated += units
        t.into_turn = 0
        self.counts.turns += 1
        version = self.engines[t.engine].weight_version
        self._apply(self.coordinator.on_turn_end(t.id, self.loop.now, turn_ids, [0.0] * units, version,
                                                 tool_call=tool > 0 or not last))
        if t.phase is Phase.DONE:  # discarded as stale
            return
        if tool > 0 or not last:
            t.phase = Phase.IN_TOOL
            t.pending = self.loop.after(tool, lambda: self._tool_returned(t))
        else:
            self._finish(t)

    def _tool_returned(self, t: SimTrajectory) -> None:
        t.pending = None
        self._apply(self.coordinator.on_tool_result(t.id, self.loop.now))
        if t.phase is Phase.DONE:
            return
        if t.turn == len(t.gen_units) - 1:
            self._finish(t)
            return
        observation = [next(self.token_ids) for _ in range(t.obs_units[t.turn])]
        t.token_ids.extend(observation)
        t.turn += 1
        self._turn_start(t, observation)

    def _finish(self, t: SimTrajectory) -> None:
        self._end(t)
        self.counts.finished += 1
        self._apply(self.coordinator.on_trajectory_done(t.id, self.loop.now, reward=0.0))

    def _discard(self, trajectory_id: int) -> None:
        t = self.live.get(trajectory_id)
        if t is None:
            return
        if t.request_id is not None:
            self._by_request.pop(t.request_id, None)
            self.engines[t.engine].abort(t.request_id)
            t.request_id = None
        if t.pending is not None:
            t.pending.cancel()
        self.counts.discarded += 1
        self._end(t)

    def _end(self, t: SimTrajectory) -> None:
        t.phase = Phase.DONE
        del self.live[t.id]
        self._release_slot(t, finished=True)
        self.engines[t.engine].release_trajectory(t.key)
        self._placement.add(t.engine, -1)

    def _release_slot(self, t: SimTrajectory, finished: bool) -> None:
        for granted in self.slots[t.engine].release(t.id, finished):
            self._submit(self.live[granted])
        if self.system.orchestration:
            self._steal_for(t.engine)

    def _steal_for(self, target: int) -> None:
        """An engine whose slots would idle takes a turn queued on another (`steal_candidate`)."""
        choice = steal_candidate(self.slots, target)
        if choice is not None:
            source, trajectory_id = choice
            self._move(self.live[trajectory_id], source, target)

    # ---- request orchestration across engines (paper §4.3) ------------------------------------

    def _orchestrate(self) -> None:
        pressure, capacity, waiting = {}, {}, {}
        for index, engine in enumerate(self.engines):
            stats = engine.scheduler.stats()
            pressure[index], capacity[index] = stats.high_pressure, stats.kv_capacity_tokens
            slots = self.slots[index]
            waiting[index] = [(tid, len(self.live[tid].token_ids)) for tid in slots.waiting
                              if slots.priorities.get(tid, Priority.LOW) < Priority.LOW]
        for move in choose_moves(pressure, capacity, waiting, self.orchestration_threshold):
            self._move(self.live[move.request], move.source, move.target)
        if self.live or not self.coordinator.finished:
            self.loop.after(self.orchestration_interval_s, self._orchestrate)

    def _move(self, t: SimTrajectory, source: int, target: int) -> None:
        """Leave `source` now; arrive on `target` with the prefix KV once it is copied."""
        exported = self.engines[source].cached_prefix_units(t.token_ids)
        self._release_slot(t, finished=True)
        self.engines[source].release_trajectory(t.key)
        self._placement.add(source, -1)
        self._placement.add(target, 1)
        t.engine, t.phase = target, Phase.MOVING
        self.counts.migrations += 1
        self.counts.migrated_units += exported
        log.info("trajectory %d moves from engine %d to %d with %d prefix units", t.id, source, target, exported)
        prefix = t.token_ids[:exported]
        t.pending = self.loop.after(exported * self.transfer_s_per_unit, lambda: self._arrive(t, prefix))

    def _arrive(self, t: SimTrajectory, prefix: list[int]) -> None:
        t.pending = None
        if prefix:
            self.engines[t.engine].queue_import(prefix, t.key, self._declared_priority(t))
        self._request_slot(t)
