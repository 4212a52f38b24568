"""The simulated rollout worker: the real coordinator's trajectories as agent loops on the
simulated engines. Every scheduling decision (placement, slots, preemption, demotion-aware
slot priority, re-prioritisation, stealing, orchestration moves, program-aware mode) is the
real `RolloutCore`'s, the same object the asyncio `RolloutWorker` drives; this driver reports
the events of the event loop to it and carries out its actions on the simulated engines.

Lengths are in units of `quantum` real tokens: a trajectory's context is a list of unit ids
(its group's prompt ids, then its own generated and observation ids).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.decisions import Decisions
from venusrl.engine.request import PartialOutput
from venusrl.rollout.core import Action, Grant, Preempt, RolloutCore, SetEnginePriority
from venusrl.rollout.orchestrator import Move
from venusrl.rollout.slots import SlotScheduler
from venusrl.sim.engine import SimEngine
from venusrl.sim.events import Event, EventLoop
from venusrl.sim.predictor import NoisyLengthPredictor
from venusrl.sim.systems import SystemSpec
from venusrl.sim.workload import TrajectoryPlan
from venusrl.types import Group, Trajectory

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
    token_ids: list[int]
    generated_mask: list[bool]  # aligned with token_ids: the units the engine sampled
    turn: int = 0
    into_turn: int = 0  # units of the current turn generated so far (across preemptions)
    generated: int = 0  # units generated in finished turns
    requests: int = 0
    request_id: str | None = None
    phase: Phase = Phase.WAITING_SLOT
    pending: Event | None = None  # the tool call or migration under way
    held_from: float | None = None  # when its request was submitted; None once it ended or was preempted
    moved_at: float = 0.0  # when its last move was decided

    @property
    def logprobs(self) -> list[float]:
        """No model, no log-probs: zeros, aligned (the record the coordinator adopts)."""
        return [0.0] * len(self.token_ids)

    @property
    def remaining_units(self) -> int:
        return sum(self.gen_units[self.turn :]) - self.into_turn


@dataclass(slots=True)
class WorkerCounts:
    turns: int = 0
    preemptions: int = 0
    migrations: int = 0
    migrated_units: int = 0
    predictions: int = 0
    priority_changes: int = 0  # priorities sent to an engine (the real engines log each `set_priority` call)
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
    move_latency_s: float = 0.0  # a move's time beyond its KV bytes (`SimSpec.move_latency_s`)
    delivery_latency_s: float = 0.0  # a finished request's output from its engine to the worker
    delivery_jitter: Callable[[], float] | None = None  # and a draw more for each (a perturbation's)
    demoted_query_s: float = 0.0  # a turn's ask for its engine's demoted set, answered
    counts: WorkerCounts = field(default_factory=WorkerCounts)
    live: dict[int, SimTrajectory] = field(default_factory=dict)
    core: RolloutCore = field(init=False)
    _by_request: dict[str, SimTrajectory] = field(default_factory=dict)

    def __post_init__(self) -> None:
        scheduler = self.system.config.scheduler
        # the live set counts in the simulator's units: the pool's, and the configured buffer scaled
        self.core = RolloutCore(self.coordinator, len(self.engines), self.slots_per_engine, self.system.slot_mode,
                                demotion_aware=self.system.demotion, orchestration=self.system.orchestration,
                                decode_balance=self.system.config.rollout.decode_balance,
                                isolate_step_enders=self.system.config.rollout.isolate_step_enders,
                                live_set=scheduler.live_set_rule, acting_decay=scheduler.acting_token_decay,
                                thrash_fraction=scheduler.live_set_thrash_fraction,
                                kv_capacity_tokens=self.engines[0].scheduler.allocator.capacity_tokens,
                                buffer_tokens=max(1, round(scheduler.live_set_buffer_tokens / self.quantum)),
                                context_tokens=lambda tid: len(self.live[tid].token_ids))
        for engine in self.engines:
            engine.on_finished = self._on_request_finished

    @property
    def slots(self) -> list[SlotScheduler]:
        return self.core.slots

    def start(self) -> None:
        self._apply(self.coordinator.start(self.loop.now))
        if self.core.orchestration:
            self.loop.after(self.orchestration_interval_s, self._orchestrate)
        self.loop.after(self.system.config.rollout.demotion_refresh_interval_s, self._refresh_demotions)
        if self.core.live_set is not None:
            self.loop.after(self.system.config.scheduler.live_set_interval_s, self._check_live_set)

    # ---- coordinator decisions and the core's actions ----------------------------------------

    def _apply(self, decisions: Decisions) -> None:
        for trajectory in decisions.start:
            self._start(trajectory)
        for trajectory_id in decisions.discarded:
            self._discard(trajectory_id)
        for group in decisions.ready:
            self.on_ready(group)
        if decisions.policy is not None:
            self._act(self.core.policy_changed(decisions.policy))

    def _act(self, actions: list[Action]) -> None:
        """Carry out the core's actions in order. Carrying one out may report events (a turn
        that ends at once), so each is checked against the core's state when its turn comes."""
        for action in actions:
            if isinstance(action, Move):
                t = self.live.get(action.request)
                if t is not None:
                    self._move(t, action.source, action.target)
                continue
            if isinstance(action, SetEnginePriority):  # the real worker sends it whether or not the turn is live
                self.counts.priority_changes += 1
            t = self.live.get(action.trajectory)
            if t is None:
                continue
            if isinstance(action, Grant):
                if action.trajectory in self.core.slots[action.engine].holders and t.phase is Phase.WAITING_SLOT:
                    self._submit(t)
            elif isinstance(action, Preempt):
                self._preempt(t)
            elif isinstance(action, SetEnginePriority):
                self.engines[action.engine].set_priority(t.key, action.priority)

    def move_figures(self) -> dict[str, dict[str, int]]:
        """The core's moves by reason and readings with room, as the real worker reports them
        (no `moves_unlanded`: the simulator counts a move when it is decided, `counts.migrations`)."""
        return self.core.move_figures()

    def _engine(self, t: SimTrajectory) -> SimEngine:
        return self.engines[self.core.engine_of[t.id]]

    def _in_engine(self, t: SimTrajectory) -> bool:
        """`t`'s request is still in its engine: submitted, and not finished in a batch whose
        outputs are still on their way to the worker (`delivery_latency_s`)."""
        return t.request_id is not None and t.request_id in self._engine(t).scheduler.requests

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
            token_ids=list(self.prompt_ids_of(trajectory)), generated_mask=[],
        )  # fmt: skip
        sim.generated_mask.extend([False] * len(sim.token_ids))
        self.live[sim.id] = sim  # first: the core's live set reads its context when placing it
        self.core.place(sim.id)
        self._turn_start(sim, list(sim.token_ids))

    def _turn_start(self, t: SimTrajectory, context_ids: list[int]) -> None:
        self._apply(self.coordinator.on_turn_start(t.id, self.loop.now, context_ids))
        if t.phase is Phase.DONE:
            return
        if self.predictor is not None and self.system.uses_predictions:
            predicted = self.predictor.predict(t.remaining_units, t.id)
            at = t.generated
            self.loop.after(self.predictor.latency_s, lambda: self._predicted(t, predicted, at))
        self._request_slot(t)

    def _predicted(self, t: SimTrajectory, remaining: float, at_generated: int) -> None:
        if t.phase is Phase.DONE:
            return
        self.counts.predictions += 1
        self._apply(self.coordinator.on_prediction(t.id, self.loop.now, remaining, at_generated))

    def _request_slot(self, t: SimTrajectory) -> None:
        if t.id in self.core.moving:  # it asks on the target once its KV lands (`_arrive`), as the real worker
            t.phase = Phase.MOVING
            return
        t.phase = Phase.WAITING_SLOT
        asked = self.core.wants_demoted(t.id)
        if asked is None:
            self._act(self.core.request_slot(t.id))
        elif self.demoted_query_s > 0:  # the real worker awaits the engine's answer before it asks
            t.pending = self.loop.after(self.demoted_query_s, lambda: self._ask_knowing_demoted(t, asked))
        else:
            self._ask_knowing_demoted(t, asked)

    def _ask_knowing_demoted(self, t: SimTrajectory, engine: int) -> None:
        """Demotions change per iteration: the engine says which hold now, then the turn asks
        for its slot."""
        t.pending = None
        self._act(self.core.demoted(engine, self.engines[engine].demoted_trajectories()))
        self._act(self.core.request_slot(t.id))

    def _submit(self, t: SimTrajectory) -> None:
        remaining = t.gen_units[t.turn] - t.into_turn
        room = self._engine(t).scheduler.allocator.capacity_tokens - 1 - len(t.token_ids)
        if remaining <= 0 or room <= 0:  # preempted after its last unit, or the pool is full
            self._turn_end(t)
            return
        t.held_from = self.loop.now
        t.phase = Phase.GENERATING
        t.requests += 1
        t.request_id = f"{t.key}.{t.requests}"
        self._by_request[t.request_id] = t
        self._engine(t).add_request(t.request_id, t.token_ids, remaining, self.core.declared_priority(t.id), t.key)

    def _preempt(self, t: SimTrajectory) -> None:
        """A HIGH turn took the slot of this LOW one: abort its request, keep its tokens, and
        ask for a slot again as the real worker's turn does once its aborted stream returns:
        it reports its action over (`release_slot`, which takes it out of the queue the core
        put it in) and asks anew (`_request_slot`: the demoted-set query first where the slots
        are full), so it queues behind the turns that asked meanwhile and a slot freed before
        it asks goes to them. Not submitted yet, or finished in the batch whose outputs are
        being delivered (its turn ends when its own comes): nothing to abort, as a real stream
        that ended before the preemption."""
        if not self._in_engine(t):
            return
        partial = self._engine(t).abort(t.request_id)
        t.held_from = None  # a preempted hold is part of a turn only: not timed, as in the real worker
        self._take_output(t, partial)
        self.counts.preemptions += 1
        self._act(self.core.release_slot(t.id, self.loop.now))
        self._request_slot(t)

    def _take_output(self, t: SimTrajectory, output: PartialOutput) -> None:
        del self._by_request[output.request_id]
        t.request_id = None
        t.token_ids.extend(output.output_ids)
        t.generated_mask.extend([True] * len(output.output_ids))
        t.into_turn += len(output.output_ids)

    def _on_request_finished(self, engine: int, output: PartialOutput) -> None:
        delay = self.delivery_latency_s + (self.delivery_jitter() if self.delivery_jitter is not None else 0.0)
        if delay > 0:
            self.loop.after(delay, lambda: self._delivered(output))
        else:
            self._delivered(output)

    def _delivered(self, output: PartialOutput) -> None:
        """A finished request's output reached the worker: its turn ends (unless it was
        discarded meanwhile)."""
        t = self._by_request.get(output.request_id)
        if t is None:
            return
        self._take_output(t, output)
        self._turn_end(t)

    def _turn_end(self, t: SimTrajectory) -> None:
        t.phase = Phase.IN_TOOL  # out of generation; the tool call or the end follows
        if t.held_from is not None:  # the real worker times the same holds: grant (or resume) to turn end
            self.core.turn_held(self.loop.now - t.held_from)
            t.held_from = None
        self._act(self.core.release_slot(t.id, self.loop.now))
        units = t.into_turn
        turn_ids = t.token_ids[len(t.token_ids) - units :]
        last = t.turn == len(t.gen_units) - 1
        tool = t.tool_seconds[t.turn]
        t.generated += units
        t.into_turn = 0
        self.counts.turns += 1
        version = self._engine(t).weight_version
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
        t.generated_mask.extend([False] * len(observation))
        t.turn += 1
        self._turn_start(t, observation)

    def _finish(self, t: SimTrajectory) -> None:
        self._end(t)
        self.counts.finished += 1
        self._apply(self.coordinator.on_trajectory_done(t.id, self.loop.now, reward=0.0, record=t))

    def _discard(self, trajectory_id: int) -> None:
        t = self.live.get(trajectory_id)
        if t is None:
            return
        if t.request_id is not None:
            self._by_request.pop(t.request_id, None)
            if self._in_engine(t):
                self._engine(t).abort(t.request_id)
            t.request_id = None
        if t.pending is not None:
            t.pending.cancel()
        self.counts.discarded += 1
        self._end(t)

    def _end(self, t: SimTrajectory) -> None:
        t.phase = Phase.DONE
        del self.live[t.id]
        engine = self._engine(t)
        self._act(self.core.finish(t.id))
        engine.release_trajectory(t.key)

    # ---- moves between engines: stealing and request orchestration (paper §4.3) ---------------

    def _orchestrate(self) -> None:
        loads = [engine.load() for engine in self.engines]
        self._act(self.core.orchestrate(loads, lambda tid: len(self.live[tid].token_ids), self.orchestration_threshold))
        if self.live or not self.coordinator.finished:
            self.loop.after(self.orchestration_interval_s, self._orchestrate)

    def _check_live_set(self) -> None:
        """As the real worker: every `scheduler.live_set_interval_s`, the engines' counters the
        live set still reads, then the live-set check."""
        for index in self.core.engines_to_observe():
            counters = self.engines[index].scheduler.counters
            self.core.observe_engine(index, counters.prompt_tokens, counters.recomputed_tokens)
        self._act(self.core.check_live_set(self.loop.now))
        if self.live or not self.coordinator.finished:
            self.loop.after(self.system.config.scheduler.live_set_interval_s, self._check_live_set)

    def _refresh_demotions(self) -> None:
        """As the real worker: every `rollout.demotion_refresh_interval_s`, the engines where
        turns wait report their demoted sets."""
        for index in self.core.stale_demotions():
            self._act(self.core.demoted(index, self.engines[index].demoted_trajectories()))
        if self.live or not self.coordinator.finished:
            self.loop.after(self.system.config.rollout.demotion_refresh_interval_s, self._refresh_demotions)

    def _move(self, t: SimTrajectory, source: int, target: int) -> None:
        """The core moved `t` (it left `source`'s slots): export its prefix KV, release it on
        `source`, and arrive on `target` with the KV once it is copied."""
        exported = self.engines[source].cached_prefix_units(t.token_ids)
        self.engines[source].release_trajectory(t.key)
        if t.request_id is None:  # else a preemption found its output on the way: that ends the turn (`_arrive`)
            t.phase = Phase.MOVING
        t.moved_at = self.loop.now
        self.counts.migrations += 1
        self.counts.migrated_units += exported
        log.info("trajectory %d moves from engine %d to %d with %d prefix units", t.id, source, target, exported)
        prefix = t.token_ids[:exported]
        t.pending = self.loop.after(self.move_latency_s + exported * self.transfer_s_per_unit,
                                    lambda: self._arrive(t, prefix))

    def _arrive(self, t: SimTrajectory, prefix: list[int]) -> None:
        """The prefix KV landed: the turn asks for a slot on the target. A turn preempted while
        its finished output was on its way to the worker is moved as a waiter by the core, but
        that output ends the turn (`_delivered`), before or after the move lands: its next turn
        asks once it starts (`_request_slot`), not the landing."""
        waiting = t.phase is Phase.MOVING
        if waiting:
            t.pending = None
        if not self.core.arrived(t.id):
            return
        self.core.move_took(self.loop.now - t.moved_at)
        if prefix:
            self._engine(t).queue_import(prefix, t.key, self.core.declared_priority(t.id))
        if waiting:
            self._request_slot(t)
