"""RolloutCore: every scheduling decision of a rollout worker, as pure code (DESIGN.md §3).

Two drivers run it: the asyncio `RolloutWorker` (real engines) and the simulator's
`SimWorker` (simulated engines on an event loop). Each reports events (a trajectory starts,
a turn wants a slot, a turn's action ends, a trajectory ends, the policy changed, the
engine demoted some trajectories, it is time to orchestrate, a move landed) and carries
out the actions the core returns (`Grant`, `Preempt`, `SetEnginePriority`, `Move`). The
core holds no clock, no engine and no task: the drivers own those.

Decisions (paper §4.3):
- Placement: a new trajectory goes to the engine with the fewest live trajectories
  (O(log E)) and stays there, for its KV, unless moved.
- Slots: per engine, a `SlotScheduler` (mode `priority`, `action_level` or
  `trajectory_level`); in priority mode a PROMOTED/HIGH turn preempts a LOW holder.
- Live set (optional, `rollout/live_set.py`): programs pause so the live ones' KV fits each
  engine's pool (ThunderAgent's rule, or venus's ranked by the coordinator's priorities); a
  paused program's turn waits outside the slots until a periodic check resumes it.
- Priorities: the *declared* priority (what the engine is told) is the coordinator's
  policy in priority mode, LOW in the other modes. The *slot* priority is the
  declared one, except LOW for a trajectory its engine has demoted (residency-aware
  demotion): it cannot get KV while HIGH work fills the pool, so it must not keep a slot
  from one that can.
- A policy change re-prioritises only the trajectories it touched (O(change)).
- Idle-slot stealing: an engine whose slots would idle takes the last waiter (least urgent,
  latest) of the engine with the most waiters, when the move pays (`_move_pays`: the wait it
  saves against what a move takes, both timed by the drivers); orchestration:
  `choose_moves` over the HIGH KV pressure.
- Decode balance (optional, beyond the paper): an urgent turn asking for a slot moves to the
  engine where the least context generates (`lighter_engine`; the decode load counts the
  context of each slot holder and of each turn moving there; among engines with a free slot
  and no waiter), once a turn, if that engine's HIGH KV stays under `BALANCE_ROOM` of its
  pool with the turn's context and the move pays (`_balance_pays`). A decode step reads
  every generating turn's KV; where many turns share an engine and another has few, the
  critical ones decode faster there, and LOW turns stay where their KV is (but beside a step
  ender, below).
- Isolation of the step enders (optional, with decode balance): while the pool has room (the
  mean HIGH KV pressure under `ISOLATION_PRESSURE`, no engine's admission stopped for memory
  since the previous reading, both read by `orchestrate`; before the first reading it is
  taken to have room), no balance move lands on an engine where a predicted step ender holds
  a slot, and a turn asking beside one moves to a lighter engine as an urgent turn would, a
  LOW one too (or one its engine demoted: it asks at its declared priority on the target,
  which has not demoted it): the step's last turns decode beside less context.
- Move semantics: a move is final when chosen. The trajectory leaves the source's slot
  queue and placement at once (so the source's other waiters are served and no second move
  picks it) and asks for a slot on the target once its prefix KV has landed (`arrived`).
  The driver releases it in the source engine after the KV is exported.

Invariants (`check_invariants`, asserted by the property tests after every event):
- a trajectory holds or waits for a slot on at most one engine, the one it is placed on,
  and never while it is moving or paused;
- holders <= slots on every engine, and a waiter exists only when every slot is held;
- priority mode: a PROMOTED/HIGH turn waits only while no LOW turn holds a slot on its
  engine: it preempts one when it asks, and a policy change or a demotion that makes a
  holder LOW under waiting urgent turns hands them its slot (`_serve_urgent`);
- the placement's load of each engine is the number of trajectories placed on it;
- decode balance: each engine's decode load is the context counted for its slot holders and
  the turns moving to it, each trajectory counted once, on the engine it is placed on.
Isolation's rule (asserted by the property tests at every move): a balance move never lands
beside a step ender while the pool has room, and moves a LOW turn only from beside one.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.decisions import PriorityPolicy
from venusrl.engine.stats import EngineLoad
from venusrl.rollout.live_set import BUFFER_PER_PROGRAM, THRASH_FRACTION, LiveSet, LiveSetRuleName
from venusrl.rollout.orchestrator import Move, choose_moves, lighter_engine
from venusrl.rollout.slots import SlotMode, SlotScheduler, steal_candidate
from venusrl.types import Priority


@dataclass(slots=True, frozen=True)
class Grant:
    """The trajectory holds a slot on `engine`: submit its turn there at `priority`."""

    trajectory: int
    engine: int
    priority: Priority


@dataclass(slots=True, frozen=True)
class Preempt:
    """Abort the trajectory's request on `engine`; it keeps its tokens and waits for a slot
    again (the slot scheduler has queued it)."""

    trajectory: int
    engine: int


@dataclass(slots=True, frozen=True)
class SetEnginePriority:
    """Tell `engine` the trajectory's new declared priority (its KV tier, its admission)."""

    trajectory: int
    engine: int
    priority: Priority


Action = Grant | Preempt | SetEnginePriority | Move  # Move(request=trajectory, source, target)


# Decode balance moves a turn only to an engine whose HIGH KV, with the turn's context, stays
# under this share of its pool (its last `orchestrate` reading): the prefix must land without
# evicting the KV the target's own turns come back to. Measured in the simulator's Fig. 10
# cells (results/sim-thunderagent/decode-balance/): without it, moves into pools that bind
# (Qwen3-4B batch 64, Qwen3-32B batch 16) cost 3-8% of the run's time.
BALANCE_ROOM = 0.5
# Isolation of the predicted step enders (decode balance's second rule, beyond the paper): the
# turns predicted to end the next training step (`DataCoordinator.predicted_step_enders`, with
# this share) keep their engines to themselves while the pool has room: the engines' mean HIGH
# KV pressure under ISOLATION_PRESSURE and no admission stopped for memory since the previous
# reading. Where pools bind, the turns moved away evict KV that other turns come back to.
# Measured over seeds x perturbations in the simulator's Fig. 10 cells
# (results/sim-thunderagent/isolation/): gated, 1.2% sooner at Qwen3-4B batch 16 (27 of 36
# runs), within the noise elsewhere; ungated it cost 1.8% at Qwen3-32B batch 16, and gated by
# pressure alone it acted at 4B batch 64, whose pool binds on LOW KV while HIGH pressure reads low.
STEP_ENDER_SHARE = 0.5
ISOLATION_PRESSURE = 0.35


class LeastLoaded:
    """The engine with the fewest live trajectories in O(log E): a heap with lazy entries;
    ties go to the lowest index."""

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


class RolloutCore:
    """Slots, priorities, placement and moves of the trajectories of `engines` engines.
    Trajectory ids are the coordinator's; an engine knows a trajectory as `str(id)`."""

    def __init__(
        self,
        coordinator: DataCoordinator,
        engines: int,
        slots_per_engine: int,
        mode: SlotMode = "priority",
        *,
        demotion_aware: bool = True,
        orchestration: bool = True,
        live_set: LiveSetRuleName | None = None,
        kv_capacity_tokens: int = 0,
        context_tokens: Callable[[int], int] | None = None,
        buffer_tokens: int = BUFFER_PER_PROGRAM,
        acting_decay: bool = False,
        thrash_fraction: float = THRASH_FRACTION,
        decode_balance: bool = False,
        isolate_step_enders: bool = False,
    ) -> None:
        """`live_set`: pause programs so the live ones' KV fits each engine's
        `kv_capacity_tokens` (`rollout/live_set.py`), ThunderAgent's rule or venus's (on an
        engine that recomputes more than `thrash_fraction` of its requests' context); the
        driver's `context_tokens` of a trajectory, in the capacity's units, feed it."""
        if engines < 1:
            raise ValueError(f"engines must be >= 1, got {engines}")
        if live_set is not None and (context_tokens is None or kv_capacity_tokens < 1):
            raise ValueError("a live set needs the engines' kv_capacity_tokens and the trajectories' context_tokens")
        if live_set is not None and mode == "trajectory_level":
            # a live set pauses programs between turns; a trajectory-level slot is held through
            # them, so a paused program would keep a slot it cannot use (no config combines them)
            raise ValueError("a live set cannot pause programs that hold trajectory-level slots: use another mode")
        self.coordinator, self.mode = coordinator, mode
        self.demotion_aware = demotion_aware and mode == "priority"
        self.orchestration = orchestration and mode == "priority" and engines > 1
        self.decode_balance = decode_balance and self.orchestration
        self.isolation = isolate_step_enders and self.decode_balance
        if self.decode_balance and context_tokens is None:
            raise ValueError("decode balance needs the trajectories' context_tokens")
        self.context_tokens = context_tokens
        self.live_set = None if live_set is None else LiveSet(
            [kv_capacity_tokens] * engines, live_set, buffer_tokens=buffer_tokens, acting_decay=acting_decay,
            urgency=self._urgency, thrash_fraction=thrash_fraction)
        self.slots = [SlotScheduler(slots_per_engine, mode, coordinator.critical_order) for _ in range(engines)]
        self.engine_of: dict[int, int] = {}  # placed trajectory -> engine
        self.moving: set[int] = set()  # moved, prefix KV not landed yet
        self.placement = LeastLoaded(engines)
        self._demoted: list[frozenset[str]] = [frozenset()] * engines  # as each engine last reported
        self._applied = PriorityPolicy(0, frozenset(), frozenset())  # what policy_changed last applied
        # running means of how long a turn holds a slot and a move takes (`turn_held`,
        # `move_took`); None until the first is timed
        self._turn_s: float | None = None
        self._move_s: float | None = None
        # decode balance: each engine's decode load, the context counted for each trajectory
        # (engine, tokens), the trajectories moved by it since their turn last ended, and each
        # engine's HIGH KV pressure and pool as `orchestrate` last read them
        self.decode_loads = [0] * engines
        self._decode_context: dict[int, tuple[int, int]] = {}
        self._balanced: set[int] = set()
        self._pressure: dict[int, float] = {}
        self._capacity: dict[int, int] = {}
        # isolation: whether the pool had room at the last reading (taken to before the first,
        # as `_has_room` does, on every engine), and each engine's running total of admissions
        # stopped for memory at it
        self.pool_has_room = True
        self._memory_stalls: dict[int, int] = {}
        # moves decided, by what decided them: `pressure` (orchestration), `steal` (an idle
        # engine), `balance` (decode balance), `isolation` (decode balance of a turn asking
        # beside a step ender); and the orchestration readings that found the pool with room
        self.moves_by_reason: Counter[str] = Counter()
        self.room_readings = {"with_room": 0, "all": 0}

    # ---- priorities ------------------------------------------------------------------------

    def declared_priority(self, trajectory_id: int, policy: PriorityPolicy | None = None) -> Priority:
        """What the engine is told (see the module docstring)."""
        trajectory = self.coordinator.trajectory(trajectory_id)
        if trajectory is None or self.mode != "priority":
            return Priority.LOW
        return (policy or self.coordinator.policy).priority(trajectory.group_id, trajectory_id)

    def slot_priority(self, trajectory_id: int, policy: PriorityPolicy | None = None) -> Priority:
        engine = self.engine_of.get(trajectory_id)
        if self.demotion_aware and engine is not None and str(trajectory_id) in self._demoted[engine]:
            return Priority.LOW
        return self.declared_priority(trajectory_id, policy)

    # ---- events ----------------------------------------------------------------------------

    def place(self, trajectory_id: int, engine: int | None = None) -> int:
        """A new trajectory: the least-loaded engine (or `engine`), for its whole life."""
        if trajectory_id in self.engine_of:
            raise ValueError(f"trajectory {trajectory_id} is already placed on engine {self.engine_of[trajectory_id]}")
        if engine is None:
            engine = self.placement.take()
        else:
            self.placement.add(engine, 1)
        self.engine_of[trajectory_id] = engine
        if self.live_set is not None:
            trajectory = self.coordinator.trajectory(trajectory_id)
            group = trajectory.group_id if trajectory is not None else -1
            self.live_set.start(trajectory_id, group, self.context_tokens(trajectory_id), engine)
            self._replace(trajectory_id, self.live_set.programs[trajectory_id].engine)
        return self.engine_of[trajectory_id]

    def wants_demoted(self, trajectory_id: int) -> int | None:
        """The engine whose demoted set the driver should report (`demoted`) before this
        turn asks for a slot: it finds the slots full, so who holds them at which slot
        priority decides whether it preempts and where it queues, and demotions change at
        every engine iteration. None: no need to ask."""
        engine = self.engine_of[trajectory_id]
        slots = self.slots[engine]
        if self.demotion_aware and trajectory_id not in slots.holders and len(slots.holders) >= slots.slots:
            return engine
        return None

    def demoted(self, engine: int, demoted: Iterable[str]) -> list[Action]:
        """The engine reports the trajectories it has demoted: every holder and waiter there
        gets its slot priority again (a demoted one is LOW), and an urgent turn already
        waiting there takes the slot of a holder that is LOW now (`_serve_urgent`)."""
        self._demoted[engine] = frozenset(demoted)
        slots = self.slots[engine]
        for other in [*slots.holders, *slots.waiting]:
            slots.set_priority(other, self.slot_priority(other))
        return self._serve_urgent(engine)

    def stale_demotions(self) -> list[int]:
        """The engines whose demoted sets the driver should report (`demoted`) at its periodic
        refresh: those where turns wait, since an engine demotes and promotes at its own
        iterations and a stale view can leave an urgent turn queued behind a holder that is
        LOW there now (or one promoted back behind a LOW holder). Without waiters nothing
        is decided by it until a turn asks (`wants_demoted`)."""
        if not self.demotion_aware:
            return []
        return [engine for engine, slots in enumerate(self.slots) if slots.waiting]

    def request_slot(self, trajectory_id: int) -> list[Action]:
        """A turn wants to generate. Granted now (a `Grant`, maybe after a `Preempt` of a LOW
        holder), or it waits; a waiter may be stolen by an idle engine (`Move`)."""
        if trajectory_id in self.moving:
            raise ValueError(f"trajectory {trajectory_id} asks for a slot while it is moving")
        if self.live_set is not None and not self.live_set.wants(trajectory_id, self.context_tokens(trajectory_id)):
            # paused: it asks once a live-set check resumes it (`check_live_set`), or now if its
            # engine has nothing to run (venus's rule)
            return self._resume_for_idle(self.engine_of[trajectory_id])
        return self._ask(trajectory_id)

    def _ask(self, trajectory_id: int) -> list[Action]:
        engine = self.engine_of[trajectory_id]
        if trajectory_id in self.slots[engine].holders:  # kept through a tool call, or re-granted
            return [self._grant(trajectory_id, engine)]
        move = self._balance(trajectory_id, engine)
        if move is not None:
            return [move]
        granted, victim = self.slots[engine].request(trajectory_id, self.slot_priority(trajectory_id))
        actions: list[Action] = []
        if victim is not None:
            actions.append(self._preempt(victim, engine))
        if granted:
            actions.append(self._grant(trajectory_id, engine))
        elif self.orchestration:  # queued here while an engine idles: move there
            for other in range(len(self.slots)):
                actions.extend(self._steal_for(other))
        return actions

    def release_slot(self, trajectory_id: int, now: float = 0.0) -> list[Action]:
        """The turn's action ended (its trajectory goes on to a tool call or its next turn);
        in trajectory-level mode it keeps its slot. `now`: the driver's clock (a live set's
        decay of tool-call tokens reads it)."""
        actions: list[Action] = []
        self._balanced.discard(trajectory_id)
        if self.live_set is not None and trajectory_id in self.engine_of:
            self.live_set.acted(trajectory_id, self.context_tokens(trajectory_id), now)
            actions += self._tell_paused()
        return actions + self._release(trajectory_id, finished=False)

    def engines_to_observe(self) -> list[int]:
        """The engines whose counters the live set still reads before each check (venus's
        rule, on engines not yet engaged): the driver reports them with `observe_engine`."""
        return self.live_set.watching() if self.live_set is not None else []

    def observe_engine(self, engine: int, prompt_tokens: int, recomputed_tokens: int) -> bool:
        """The engine's running totals of context tokens brought by its requests and of those
        recomputed (`LiveSet.observe`). Returns whether its live set engaged now."""
        return self.live_set is not None and self.live_set.observe(engine, prompt_tokens, recomputed_tokens)

    def check_live_set(self, now: float) -> list[Action]:
        """The periodic live-set check (every `scheduler.live_set_interval_s`): paused programs
        that fit resume (one that never ran may be placed on another engine), those with a turn
        pending ask for their slot; engines over capacity pause programs."""
        if self.live_set is None:
            return []
        actions: list[Action] = []
        resumed = self.live_set.check(now)
        for trajectory_id, _ in resumed:
            self._replace(trajectory_id, self.live_set.programs[trajectory_id].engine)
        for trajectory_id, pending in resumed:
            if self.mode == "priority":  # its KV is protected again at its own priority
                actions.append(SetEnginePriority(trajectory_id, self.engine_of[trajectory_id],
                                                 self.declared_priority(trajectory_id)))
            if pending:
                actions.extend(self._ask(trajectory_id))
        return actions + self._tell_paused()

    def _tell_paused(self) -> list[Action]:
        """Engines learn that programs paused: their KV drops to the LOW tier (priority mode;
        the other modes declare everything LOW), so a paused program's cache never holds
        memory a live one needs (on a small pool, a paused HIGH program's KV kept live LOW
        turns out for good: the engine's LOW requests may not evict HIGH KV). Only the
        engine is told: a policy change or the resume declares its priority again, and its
        turn, once resumed, asks at its own priority (declared LOW while paused, venus's
        critical programs lost their KV as they waited: 23,575 s against 20,328 s in Fig. 10's
        32B batch-64 cell at coarsening 2, seed 1)."""
        paused = self.live_set.take_paused() if self.live_set is not None else []
        if self.mode != "priority":
            return []
        return [SetEnginePriority(t, self.engine_of[t], Priority.LOW) for t in paused if t in self.engine_of]

    def finish(self, trajectory_id: int) -> list[Action]:
        """The trajectory ended (done, failed or discarded): it leaves its engine."""
        if trajectory_id not in self.engine_of:
            return []
        actions = self._release(trajectory_id, finished=True)
        if self.live_set is not None:
            self.live_set.finish(trajectory_id)
        self.moving.discard(trajectory_id)
        self._balanced.discard(trajectory_id)
        self._uncount(trajectory_id)
        self.placement.add(self.engine_of.pop(trajectory_id), -1)
        return actions

    def policy_changed(self, policy: PriorityPolicy) -> list[Action]:
        """The coordinator published a new policy: only the trajectories whose group entered
        or left the HIGH set or whose promotion changed get a new priority (O(change)); one
        started since reads the current policy when it asks for a slot. A holder that drops
        to LOW keeps its slot unless an urgent turn already waits on its engine
        (`_serve_urgent`): preempting every holder at every re-ranking aborts turns the next
        one flips back (on the small +kv_residency simulation it doubled preemptions and
        added 4-55% prefill), but leaving an urgent turn queued behind LOW work stalls the
        critical path, and where KV binds it deadlocks: the LOW holder cannot be admitted
        beside the waiting trajectories' HIGH KV."""
        if self.mode != "priority":
            return []
        old, self._applied = self._applied, policy
        actions: list[Action] = []
        engines: set[int] = set()
        for trajectory_id in self.coordinator.touched_by(policy, old):
            engine = self.engine_of.get(trajectory_id)
            if engine is None:
                continue
            engines.add(engine)
            self.slots[engine].set_priority(trajectory_id, self.slot_priority(trajectory_id, policy))
            actions.append(SetEnginePriority(trajectory_id, engine, self.declared_priority(trajectory_id, policy)))
        for engine in sorted(engines):
            actions.extend(self._serve_urgent(engine))
        return actions

    def orchestrate(self, loads: Sequence[EngineLoad], context_tokens: Callable[[int], int],
                    threshold: float) -> list[Move]:
        """Request orchestration (paper §4.3): from engines past `threshold` HIGH KV pressure,
        move waiting urgent turns (oldest first) to the least-pressured engine. `loads`: every
        engine's, by index. Decode balance reads the same pressures until the next call, and
        isolation whether the pool has room: the mean pressure under `ISOLATION_PRESSURE` and
        no engine's running total of admissions stopped for memory grown since the previous
        call; an engine that does not count them (None) leaves no room."""
        if not self.orchestration:
            return []
        if len(loads) != len(self.slots):
            raise ValueError(f"orchestrate needs the loads of all {len(self.slots)} engines, got {len(loads)}")
        self._pressure = pressure = {engine: load.high_pressure for engine, load in enumerate(loads)}
        self._capacity = {engine: load.kv_capacity_tokens for engine, load in enumerate(loads)}
        stalls = [load.memory_stalls for load in loads]
        counted = all(count is not None for count in stalls)
        grown = counted and any(count > self._memory_stalls.get(engine, 0) for engine, count in enumerate(stalls))
        self.pool_has_room = counted and not grown and sum(pressure.values()) / len(pressure) < ISOLATION_PRESSURE
        self.room_readings["all"] += 1
        self.room_readings["with_room"] += self.pool_has_room
        if counted:
            self._memory_stalls = dict(enumerate(stalls))
        waiting = {index: [(tid, context_tokens(tid)) for tid in slots.waiting
                           if slots.priorities.get(tid, Priority.LOW) < Priority.LOW]
                   for index, slots in enumerate(self.slots)}
        moves = choose_moves(pressure, self._capacity, waiting, threshold)
        for move in moves:
            self._commit_move(move)
        self.moves_by_reason["pressure"] += len(moves)
        return moves

    def move_figures(self) -> dict[str, dict[str, int]]:
        """The moves decided, by reason, and the orchestration readings that found the pool with
        room, as every driver reports them (bench rounds, training metrics, simulator JSON)."""
        return {"moves_by_reason": dict(self.moves_by_reason), "room_readings": dict(self.room_readings)}

    def arrived(self, trajectory_id: int) -> bool:
        """The moved trajectory's prefix KV landed on its new engine; it may ask for a slot
        there. False when it ended meanwhile."""
        if trajectory_id not in self.moving:
            return False
        self.moving.discard(trajectory_id)
        self._uncount(trajectory_id)  # counted again once granted there
        return True

    def turn_held(self, seconds: float) -> None:
        """A turn held its slot `seconds`, from its grant to its release (the driver's clock)."""
        self._turn_s = _running_mean(self._turn_s, seconds)

    def move_took(self, seconds: float) -> None:
        """A move took `seconds`, from the core's decision to the turn asking on the target."""
        self._move_s = _running_mean(self._move_s, seconds)

    # ---- internals -------------------------------------------------------------------------

    def _urgency(self, trajectory_id: int) -> tuple[int, float]:
        """Venus's live-set rank: the declared priority, then the critical order."""
        return int(self.declared_priority(trajectory_id)), self.coordinator.critical_order(trajectory_id)

    def _replace(self, trajectory_id: int, engine: int) -> None:
        """Place a trajectory that holds no KV and no slot anywhere (a new program the live
        set queued) on another engine."""
        source = self.engine_of[trajectory_id]
        if source != engine:
            self.placement.add(source, -1)
            self.placement.add(engine, 1)
            self.engine_of[trajectory_id] = engine

    def _grant(self, trajectory_id: int, engine: int) -> Grant:
        self._count(trajectory_id, engine)
        return Grant(trajectory_id, engine, self.declared_priority(trajectory_id))

    def _preempt(self, trajectory_id: int, engine: int) -> Preempt:
        self._uncount(trajectory_id)
        return Preempt(trajectory_id, engine)

    def _serve_urgent(self, engine: int) -> list[Action]:
        """Urgent turns waiting on `engine` take the slots of LOW holders there."""
        actions: list[Action] = []
        for waiter, victim in self.slots[engine].serve_urgent():
            actions += [self._preempt(victim, engine), self._grant(waiter, engine)]
        return actions

    def _release(self, trajectory_id: int, finished: bool) -> list[Action]:
        engine = self.engine_of.get(trajectory_id)
        if engine is None:
            return []
        self._uncount(trajectory_id)
        actions: list[Action] = [self._grant(t, engine) for t in self.slots[engine].release(trajectory_id, finished)]
        if self.orchestration:
            actions.extend(self._steal_for(engine))
        return actions + self._resume_for_idle(engine)

    def _resume_for_idle(self, engine: int) -> list[Action]:
        """`engine` holds and queues no turn: a paused program resumes there at once
        (`LiveSet.resume_for_idle`, venus's rule) and asks for its slot."""
        slots = self.slots[engine]
        if self.live_set is None or slots.holders or slots.waiting:
            return []
        trajectory_id = self.live_set.resume_for_idle(engine)
        if trajectory_id is None:
            return []
        self._replace(trajectory_id, engine)
        actions: list[Action] = []
        if self.mode == "priority":  # its KV is protected again at its own priority
            actions.append(SetEnginePriority(trajectory_id, engine, self.declared_priority(trajectory_id)))
        return actions + self._ask(trajectory_id)

    def _steal_for(self, target: int) -> list[Action]:
        """An engine whose slots would idle takes a turn queued on another (`steal_candidate`)."""
        choice = steal_candidate(self.slots, target, pays=self._move_pays)
        if choice is None:
            return []
        source, trajectory_id = choice
        move = Move(trajectory_id, source, target)
        self._commit_move(move)
        self.moves_by_reason["steal"] += 1
        return [move]

    def _move_pays(self, source: SlotScheduler) -> bool:
        """Whether taking `source`'s last waiter saves more than the move costs. Left there, it
        would wait about a slot's share of a turn (`turn_s / slots`) for each waiter, itself
        included; moved, it asks for a slot on the idle target after `move_s`. Between engine
        processes of a small model a move takes longer than several turns (measured: 40-110 ms
        median against 50 ms turns on 3 slots), so stealing every time slows the run; with fast
        copies and long turns it pays almost always. Until a move and a turn have been timed,
        it is taken to pay."""
        if self._move_s is None or self._turn_s is None:
            return True
        return len(source.waiting) * self._turn_s / source.slots > self._move_s

    def _balance(self, trajectory_id: int, engine: int) -> Move | None:
        """Decode balance (module docstring): the move of an urgent turn, or of any turn beside
        a step ender while isolating, asking for a slot on `engine` to a lighter one, committed,
        or None."""
        if not self.decode_balance or trajectory_id in self._balanced:
            return None
        enders = self.step_enders()
        beside_ender = trajectory_id not in enders and not enders.isdisjoint(self.slots[engine].holders)
        if self.slot_priority(trajectory_id) == Priority.LOW and not beside_ender:
            return None
        context = self.context_tokens(trajectory_id)
        eligible = [i for i, slots in enumerate(self.slots) if slots.idle and enders.isdisjoint(slots.holders)]
        target = lighter_engine(self.decode_loads, engine, context, eligible)
        if (target is None or not self._has_room(target, context)
                or not self._balance_pays(self.decode_loads[engine], self.decode_loads[target], context)):
            return None
        self._balanced.add(trajectory_id)
        self.moves_by_reason["isolation" if beside_ender else "balance"] += 1
        self._start_move(trajectory_id, engine, target)
        self._count(trajectory_id, target)  # on its way: the next turns asking see it there
        return Move(trajectory_id, engine, target)

    def step_enders(self) -> frozenset[int]:
        """The predicted step enders isolation keeps apart (none while off or the pool is short)."""
        if not (self.isolation and self.pool_has_room):
            return frozenset()
        return self.coordinator.predicted_step_enders(STEP_ENDER_SHARE)

    def _has_room(self, engine: int, context: int) -> bool:
        """The engine's HIGH KV, with `context` more, stays under `BALANCE_ROOM` of its pool (as
        `orchestrate` last read it; taken to hold before the first reading)."""
        if engine not in self._pressure:
            return True
        return self._pressure[engine] + context / max(1, self._capacity[engine]) < BALANCE_ROOM

    def _balance_pays(self, source_load: int, target_load: int, context: int) -> bool:
        """Whether the turn's time saved exceeds the move's. Its decode steps read `context`
        plus the engine's load, and a fixed cost (weights, launch) that a move does not change,
        so they shrink by at most `(source_load - target_load) / (source_load + context)`: that
        share of a turn's slot time (`turn_held`) against a move's (`move_took`). Until both
        are timed, it is taken to pay. Between engine processes of a small model a move takes
        longer than a turn (the rollout bench), so none pays there."""
        if self._move_s is None or self._turn_s is None:
            return True
        return self._move_s < self._turn_s * (source_load - target_load) / max(1, source_load + context)

    def _count(self, trajectory_id: int, engine: int) -> None:
        """Count the trajectory's context in `engine`'s decode load (replacing what was counted)."""
        if not self.decode_balance:
            return
        self._uncount(trajectory_id)
        tokens = self.context_tokens(trajectory_id)
        self._decode_context[trajectory_id] = (engine, tokens)
        self.decode_loads[engine] += tokens

    def _uncount(self, trajectory_id: int) -> None:
        counted = self._decode_context.pop(trajectory_id, None)
        if counted is not None:
            self.decode_loads[counted[0]] -= counted[1]

    def _commit_move(self, move: Move) -> None:
        trajectory_id, source, target = move.request, move.source, move.target
        if self.engine_of.get(trajectory_id) != source or trajectory_id not in self.slots[source].waiting:
            raise ValueError(f"move of trajectory {trajectory_id}: it does not wait on engine {source}")
        self._start_move(trajectory_id, source, target)

    def _start_move(self, trajectory_id: int, source: int, target: int) -> None:
        """The trajectory leaves `source`'s queue (a turn asking again while it waits, as a
        preempted one does, can be moved too) and is placed on `target`, moving there."""
        if trajectory_id in self.slots[source].waiting:
            granted = self.slots[source].release(trajectory_id, finished=True)
            assert not granted, "a waiter leaving frees no slot"
        self.placement.add(source, -1)
        self.placement.add(target, 1)
        self.engine_of[trajectory_id] = target
        self.moving.add(trajectory_id)
        if self.live_set is not None:
            self.live_set.moved(trajectory_id, target)

    # ---- invariants ------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first invariant broken (see the module docstring)."""
        seen: dict[int, int] = {}
        for engine, slots in enumerate(self.slots):
            holders, waiting = set(slots.holders), set(slots.waiting)
            assert len(holders) <= slots.slots, f"engine {engine}: {len(holders)} holders > {slots.slots} slots"
            assert not holders & waiting, f"engine {engine}: {holders & waiting} hold and wait at once"
            assert not waiting or len(holders) == slots.slots, f"engine {engine}: a slot idles while {waiting} wait"
            for t in holders | waiting:
                assert t not in seen, f"trajectory {t} is on engines {seen[t]} and {engine}"
                seen[t] = engine
                assert self.engine_of.get(t) == engine, f"trajectory {t} queues on engine {engine}, placed elsewhere"
                assert t not in self.moving, f"trajectory {t} queues on engine {engine} while moving"
                assert self.live_set is None or not self.live_set.paused(t), f"paused trajectory {t} queues for a slot"
        assert self.moving <= self.engine_of.keys(), "a moving trajectory is not placed"
        loads = [0] * len(self.slots)
        for engine in self.engine_of.values():
            loads[engine] += 1
        assert loads == self.placement.loads, f"placement loads {self.placement.loads} != placed {loads}"
        decode_loads = [0] * len(self.slots)
        for t, (engine, tokens) in self._decode_context.items():
            decode_loads[engine] += tokens
            assert self.engine_of.get(t) == engine, f"trajectory {t}: decode load counted on {engine}, placed elsewhere"
            assert t in self.slots[engine].holders or t in self.moving, f"trajectory {t} counted, not generating"
        assert decode_loads == self.decode_loads, f"decode loads {self.decode_loads} != counted {decode_loads}"
        if self.live_set is not None:
            self.live_set.check_invariants()
            assert self.live_set.programs.keys() == self.engine_of.keys(), "live set and placement disagree"
            for t, program in self.live_set.programs.items():
                assert program.engine == self.engine_of[t], f"trajectory {t}: live set and placement disagree"


# Weight of the newest observation in the core's running means: about the last ten count.
RUNNING_MEAN_WEIGHT = 0.1


def _running_mean(mean: float | None, value: float) -> float:
    return value if mean is None else mean + RUNNING_MEAN_WEIGHT * (value - mean)
