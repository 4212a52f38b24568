"""RolloutCore: the rollout worker's decisions as pure code, under random event sequences."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from venusrl.coordinator.config import CoordinatorConfig
from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.decisions import PriorityPolicy
from venusrl.engine.stats import EngineLoad
from venusrl.rollout.core import Grant, Preempt, RolloutCore, SetEnginePriority
from venusrl.rollout.orchestrator import Move
from venusrl.types import Priority, Prompt

H, L, P = Priority.HIGH, Priority.LOW, Priority.PROMOTED


def coordinator(groups: int = 4, group_size: int = 2) -> DataCoordinator:
    prompts = [Prompt(id=str(i), messages=({"role": "user", "content": "q"},)) for i in range(groups)]
    return DataCoordinator(CoordinatorConfig(group_size=group_size, batch_groups=groups), prompts)


def started(c: DataCoordinator) -> list[int]:
    return [t.id for t in c.start(0.0).start]


def engine_loads(pressure: dict[int, float], stalls: dict[int, int | None] | None = None) -> list[EngineLoad]:
    """Every engine's load as `orchestrate` reads it, pools of 1,000 tokens; without `stalls`,
    engines that do not count their memory stalls."""
    return [EngineLoad(fraction, 1000, frozenset(), None if stalls is None else stalls[engine])
            for engine, fraction in sorted(pressure.items())]


def high_core(c: DataCoordinator) -> RolloutCore:
    """Two engines of one slot each, every trajectory declared HIGH."""
    core = RolloutCore(c, engines=2, slots_per_engine=1)
    core.declared_priority = lambda t, policy=None: H  # type: ignore[method-assign]
    return core


class Driver:
    """Applies a core's actions the way both real drivers do, and records who generates."""

    def __init__(self, core: RolloutCore) -> None:
        self.core = core
        self.generating: set[int] = set()
        self.engine_priority: dict[int, Priority] = {}
        self.moves = 0

    def apply(self, actions) -> None:
        """Every move the core decides reaches its driver once, counted under one reason."""
        for action in actions:
            if isinstance(action, Grant):
                self.generating.add(action.trajectory)
                assert self.core.engine_of[action.trajectory] == action.engine
            elif isinstance(action, Preempt):
                assert action.trajectory in self.core.slots[action.engine].waiting
                self.generating.discard(action.trajectory)
            elif isinstance(action, SetEnginePriority):
                self.engine_priority[action.trajectory] = action.priority
            elif isinstance(action, Move):
                assert action.request in self.core.moving
                self.moves += 1
            else:
                raise AssertionError(f"unknown action {action!r}")
        assert sum(self.core.moves_by_reason.values()) == self.moves


def test_a_high_turn_preempts_the_latest_low_holder_and_a_waiter_is_granted_on_release():
    c = coordinator(groups=1, group_size=3)
    a, b, h = started(c)
    core = RolloutCore(c, engines=1, slots_per_engine=2)
    core.declared_priority = lambda t, policy=None: H if t == h else L  # type: ignore[method-assign]
    for t in (a, b, h):
        core.place(t)
    assert core.request_slot(a) == [Grant(a, 0, L)]
    assert core.request_slot(b) == [Grant(b, 0, L)]
    assert core.request_slot(h) == [Preempt(b, 0), Grant(h, 0, H)]
    assert core.release_slot(h) == [Grant(b, 0, L)]
    core.check_invariants()


def two_high_on_one_slot():
    """Two trajectories declared HIGH, placed on one engine of one slot."""
    c = coordinator(groups=1, group_size=2)
    a, b = started(c)
    core = RolloutCore(c, engines=1, slots_per_engine=1)
    core.declared_priority = lambda t, policy=None: H  # type: ignore[method-assign]
    core.place(a), core.place(b)
    return core, a, b


def test_a_demoted_holder_yields_its_slot_to_an_urgent_turn():
    core, a, b = two_high_on_one_slot()
    assert core.request_slot(a) == [Grant(a, 0, H)]
    assert core.wants_demoted(b) == 0
    core.demoted(0, {str(a)})
    assert core.slot_priority(a) == L and core.declared_priority(a) == H
    assert core.request_slot(b) == [Preempt(a, 0), Grant(b, 0, H)]
    core.check_invariants()


def test_a_paused_program_gets_no_slot_until_a_check_resumes_it():
    """ThunderAgent's rule through the core: over capacity, the program in a tool call pauses;
    its next turn waits outside the slots until a check finds room for it again."""
    c = coordinator(groups=2, group_size=1)
    a, b = started(c)
    tokens = {a: 300, b: 300}
    core = RolloutCore(c, engines=1, slots_per_engine=2, mode="action_level", orchestration=False,
                       live_set="thunderagent", kv_capacity_tokens=1000, context_tokens=tokens.__getitem__)
    core.place(a), core.place(b)
    assert core.request_slot(a) == [Grant(a, 0, L)] and core.request_slot(b) == [Grant(b, 0, L)]
    tokens[a] = 600
    core.release_slot(a, now=1.0)  # a is in its tool call; 600 + 300 + 2 x 100 buffer > 1000
    assert core.check_live_set(2.0) == [] and core.live_set.paused(a) and not core.live_set.paused(b)
    assert core.request_slot(a) == [] and a not in core.slots[0].waiting
    core.check_invariants()
    core.finish(b)
    assert core.check_live_set(7.0) == [Grant(a, 0, L)] and a in core.slots[0].holders
    core.check_invariants()


def test_a_live_set_is_refused_beside_trajectory_level_slots():
    """A paused program would keep a slot it cannot use: found by the property test below
    (one engine, one slot; a turn asks, its action ends keeping the slot, a check pauses it)."""
    c = coordinator(groups=1, group_size=1)
    with pytest.raises(ValueError, match="trajectory-level"):
        RolloutCore(c, engines=1, slots_per_engine=1, mode="trajectory_level", live_set="thunderagent",
                    kv_capacity_tokens=400, context_tokens=lambda _: 60)


def test_an_idle_engine_steals_a_waiter_only_when_the_move_saves_more_than_it_takes():
    """Stealing pays when the queue's share of slot time it saves (waiters x turn / slots)
    exceeds a move's time; untimed, it is taken to pay."""
    c = coordinator(groups=4, group_size=2)
    ids = started(c)
    core = high_core(c)
    for t in ids:
        core.place(t, engine=0)
    core.request_slot(ids[0])
    core.turn_held(0.05)
    core.move_took(0.12)  # a move takes longer than two turns on one slot
    assert core.request_slot(ids[1]) == [] and core.request_slot(ids[2]) == []
    assert list(core.slots[0].waiting) == [ids[1], ids[2]] and not core.moving
    # the third waiter: 3 x 0.05 s of queue against a 0.12 s move, so engine 1 takes the one
    # engine 0 would serve last (the move's time then delays the least urgent turn)
    assert core.request_slot(ids[3]) == [Move(ids[3], 0, 1)]
    core.check_invariants()


def test_before_any_move_is_timed_an_idle_engine_steals():
    c = coordinator(groups=2, group_size=2)
    ids = started(c)
    core = high_core(c)
    core.place(ids[0], engine=0), core.place(ids[1], engine=0)
    core.turn_held(0.05)
    core.request_slot(ids[0])
    assert core.request_slot(ids[1]) == [Move(ids[1], 0, 1)]


def test_placement_is_least_loaded_and_a_stolen_waiter_leaves_its_source_at_once():
    c = coordinator(groups=2, group_size=2)
    ids = started(c)
    core = high_core(c)
    assert [core.place(t) for t in ids] == [0, 1, 0, 1]
    assert core.request_slot(ids[0]) == [Grant(ids[0], 0, H)]
    # engine 1 is idle: the waiter queued on engine 0 moves there
    assert core.request_slot(ids[2]) == [Move(ids[2], 0, 1)]
    assert core.engine_of[ids[2]] == 1 and ids[2] not in core.slots[0].waiting and ids[2] in core.moving
    core.check_invariants()
    with pytest.raises(ValueError, match="moving"):
        core.request_slot(ids[2])
    assert core.arrived(ids[2])
    assert core.request_slot(ids[2]) == [Grant(ids[2], 1, H)]
    core.check_invariants()


def two_groups_on_one_slot():
    """A coordinator with two one-trajectory groups placed on one engine of one slot."""
    c = coordinator(groups=2, group_size=1)
    a, b = started(c)
    group = {t.id: t.group_id for t in c.running_groups()[0].trajectories + c.running_groups()[1].trajectories}
    core = RolloutCore(c, engines=1, slots_per_engine=1)
    core.place(a), core.place(b)
    return c, core, (a, b), group


def test_a_policy_change_touches_only_the_changed_groups_and_preempts_nobody_while_no_urgent_turn_waits():
    c, core, (a, b), group = two_groups_on_one_slot()
    high_a = PriorityPolicy(50, frozenset({group[a]}), frozenset())
    c._policy = high_a
    core.policy_changed(high_a)
    assert core.request_slot(a) == [Grant(a, 0, H)]
    high_b = PriorityPolicy(51, frozenset({group[b]}), frozenset())
    c._policy = high_b
    # a drops to LOW and keeps its slot: b is not waiting for one
    assert core.policy_changed(high_b) == [SetEnginePriority(a, 0, L), SetEnginePriority(b, 0, H)]
    assert core.slots[0].holders.keys() == {a}
    assert core.request_slot(b) == [Preempt(a, 0), Grant(b, 0, H)]
    core.check_invariants()


def test_a_turn_that_waits_when_its_group_becomes_critical_takes_the_low_holders_slot():
    c, core, (a, b), group = two_groups_on_one_slot()
    low_all = PriorityPolicy(50, frozenset(), frozenset())
    c._policy = low_all  # a policy with no HIGH group, applied
    core.policy_changed(low_all)
    assert core.request_slot(a) == [Grant(a, 0, L)]
    assert core.request_slot(b) == []
    high_b = PriorityPolicy(51, frozenset({group[b]}), frozenset())
    c._policy = high_b
    assert core.policy_changed(high_b) == [SetEnginePriority(b, 0, H), Preempt(a, 0), Grant(b, 0, H)]
    assert core.slots[0].waiting.keys() == {a}
    core.check_invariants()


def test_a_holder_demoted_behind_a_waiting_urgent_turn_yields_its_slot():
    """The deadlock where KV binds: a HIGH turn queued behind a holder the engine demoted
    afterwards. The demotion report hands the waiter the slot."""
    core, a, b = two_high_on_one_slot()
    assert core.request_slot(a) == [Grant(a, 0, H)]
    assert core.request_slot(b) == []  # a is HIGH: b waits
    assert core.demoted(0, {str(a)}) == [Preempt(a, 0), Grant(b, 0, H)]
    assert core.demoted(0, {str(a)}) == []  # a waits at LOW now: nothing more to hand over
    core.check_invariants()


def test_orchestration_moves_an_urgent_waiter_off_the_hot_engine():
    c = coordinator(groups=2, group_size=2)
    ids = started(c)
    core = high_core(c)
    for t in ids:
        core.place(t, engine=0 if t != ids[3] else 1)
    core.request_slot(ids[3])  # engine 1 busy: nothing steals
    core.request_slot(ids[0])
    assert core.request_slot(ids[1]) == []
    moves = core.orchestrate(engine_loads({0: 1.0, 1: 0.1}), lambda t: 100, threshold=0.9)
    assert moves == [Move(ids[1], 0, 1)] and core.engine_of[ids[1]] == 1
    core.check_invariants()


def test_orchestration_reads_every_engine_or_refuses():
    """An engine left out of a reading would look like one without pressure: the core says so
    instead of moving turns onto it, and nothing it held changes."""
    core = high_core(coordinator(groups=1, group_size=2))
    with pytest.raises(ValueError, match="all 2 engines, got 1"):
        core.orchestrate(engine_loads({0: 1.0}), lambda t: 100, threshold=0.9)
    assert core.room_readings == {"with_room": 0, "all": 0} and core.pool_has_room


def balancing_core(low: frozenset[int] = frozenset()):
    """Two engines of two slots, decode balance on, every trajectory placed on engine 0 and
    declared HIGH but for `low` (indexes); contexts of 500, 200, 200 and 100 tokens."""
    c = coordinator(groups=2, group_size=2)
    ids = started(c)
    tokens = dict(zip(ids, (500, 200, 200, 100), strict=True))
    core = RolloutCore(c, engines=2, slots_per_engine=2, decode_balance=True, context_tokens=tokens.__getitem__)
    low_ids = {ids[i] for i in low}
    core.declared_priority = lambda t, policy=None: L if t in low_ids else H  # type: ignore[method-assign]
    for t in ids:
        core.place(t, engine=0)
    return core, ids


def test_an_urgent_turn_moves_to_the_engine_where_less_context_generates_once_a_turn():
    core, (a, b, _, _) = balancing_core()
    assert core.request_slot(a) == [Grant(a, 0, H)]  # engine 1 generates nothing, but neither does 0 yet
    assert core.decode_loads == [500, 0]
    assert core.request_slot(b) == [Move(b, 0, 1)]  # beside 500 tokens here, beside none there
    assert core.engine_of[b] == 1 and b in core.moving and core.decode_loads == [500, 200]  # counted on its way
    core.check_invariants()
    assert core.arrived(b) and core.decode_loads == [500, 0]
    assert core.request_slot(b) == [Grant(b, 1, H)]  # it moved for this turn already
    assert core.decode_loads == [500, 200]
    core.release_slot(a)
    assert core.decode_loads == [0, 200]
    core.check_invariants()


def test_a_low_turn_stays_where_its_kv_is():
    core, (a, _, _, d) = balancing_core(low=frozenset({3}))
    core.request_slot(a)
    assert core.request_slot(d) == [Grant(d, 0, L)]


def test_no_balance_move_into_a_pool_short_of_room_or_when_the_move_takes_longer_than_it_saves():
    core, (a, b, _, _) = balancing_core()
    core.request_slot(a)
    core.orchestrate(engine_loads({0: 0.2, 1: 0.35}), lambda t: 0, threshold=0.9)
    assert core.request_slot(b) == [Grant(b, 0, H)]  # 0.35 + 200/1000 of engine 1's pool is past half
    core, (a, b, _, _) = balancing_core()
    core.request_slot(a)
    core.turn_held(1.0)
    core.move_took(0.8)  # saves at most 1.0 s x 500 / 700 = 0.71 s of the turn
    assert core.request_slot(b) == [Grant(b, 0, H)]
    core.check_invariants()



def isolating_core(tokens: dict[int, int], low: set[int], enders: set[int], engines: int):
    """Decode balance and isolation on, `engines` engines of two slots; `low` declared LOW, the
    others HIGH; `enders` the coordinator's predicted step enders."""
    c = coordinator(groups=3, group_size=2)
    core = RolloutCore(c, engines=engines, slots_per_engine=2, decode_balance=True,
                       context_tokens=tokens.__getitem__, isolate_step_enders=True)
    core.declared_priority = lambda t, policy=None: L if t in low else H  # type: ignore[method-assign]
    c.predicted_step_enders = lambda share: frozenset(enders)  # type: ignore[method-assign]
    return core


def test_while_the_pool_has_room_no_turn_moves_beside_a_step_ender():
    c = coordinator(groups=2, group_size=2)
    e, a, x, b = started(c)
    core = isolating_core({e: 50, a: 600, x: 100, b: 100}, low=set(), enders={e}, engines=3)
    for t, engine in ((e, 0), (a, 1), (x, 2), (b, 1)):
        core.place(t, engine=engine)
    for t in (e, a, x):
        core.request_slot(t)
    assert core.decode_loads == [50, 600, 100]
    assert core.request_slot(b) == [Move(b, 1, 2)]  # engine 0 is lighter, but a step ender generates there
    core.check_invariants()


def test_a_low_turn_beside_a_step_ender_moves_to_a_lighter_engine_while_the_pool_has_room():
    def asked_beside_the_ender(readings):
        c = coordinator(groups=1, group_size=2)
        e, d = started(c)
        core = isolating_core({e: 500, d: 50}, low={d}, enders={e}, engines=2)
        core.place(e, engine=0), core.place(d, engine=0)
        core.request_slot(e)
        for pressure, stalls in readings:
            core.orchestrate(engine_loads(pressure, stalls), lambda t: 0, 0.9)
        return core.request_slot(d), d

    actions, d = asked_beside_the_ender([])  # before the first reading the pool is taken to have room
    assert actions == [Move(d, 0, 1)]
    actions, d = asked_beside_the_ender([({0: 0.3, 1: 0.3}, {0: 4, 1: 0}), ({0: 0.3, 1: 0.3}, {0: 4, 1: 0})])
    assert actions == [Move(d, 0, 1)]  # stalls counted before, none since the previous reading
    for readings in ([({0: 0.3, 1: 0.4}, {0: 0, 1: 0})],  # mean HIGH pressure 0.35: not under it
                     [({0: 0.1, 1: 0.1}, {0: 0, 1: 0}), ({0: 0.1, 1: 0.1}, {0: 0, 1: 1})],  # an admission stopped
                     [({0: 0.1, 1: 0.1}, {0: 0, 1: None})],  # an engine that does not say (an older release over the wire)
                     [({0: 0.1, 1: 0.1}, None)]):
        actions, d = asked_beside_the_ender(readings)
        assert actions == [Grant(d, 0, L)], readings  # no room: it stays where its KV is


def test_a_turn_that_asks_again_while_it_waits_leaves_the_queue_it_is_moved_from():
    """A preempted turn's driver asks again while the core has it queued; decode balance may move
    it then (the steal did not pay: it saves half a turn on two slots, the move takes 0.6 of one),
    and it must leave the source's queue (found by the property test below: it stayed queued on
    the engine it left)."""
    c = coordinator(groups=3, group_size=2)
    a, x, b, c1, d, _ = started(c)
    tokens = {a: 500, x: 500, b: 200, c1: 100, d: 100, _: 100}
    core = RolloutCore(c, engines=2, slots_per_engine=2, decode_balance=True, context_tokens=tokens.__getitem__)
    core.declared_priority = lambda t, policy=None: H  # type: ignore[method-assign]
    for t, engine in ((c1, 1), (d, 1), (a, 0), (x, 0), (b, 0)):
        core.place(t, engine=engine)
        core.request_slot(t)
    assert b in core.slots[0].waiting  # both engines full when it asked
    core.turn_held(1.0)
    core.move_took(0.6)
    assert core.release_slot(d) == []  # engine 1 has a free slot; stealing b does not pay
    assert core.request_slot(b) == [Move(b, 0, 1)]  # 100 + 200 < 1000, and it saves 0.75 of a turn
    assert b not in core.slots[0].waiting and core.engine_of[b] == 1
    core.check_invariants()


events = st.lists(st.tuples(
    st.sampled_from(["request", "release", "finish", "policy", "demoted", "orchestrate", "arrive", "check",
                     "observe"]),
    st.integers(0, 11), st.integers(0, 3), st.frozensets(st.integers(0, 11), max_size=4),
), max_size=120)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from(["priority", "action_level", "trajectory_level"]),
       st.sampled_from([None, "thunderagent", "venus"]), st.sampled_from([0.0, 0.1]), st.booleans(), events)
def test_invariants_hold_under_any_event_sequence(engines, slots, mode, live_set, thrash_fraction, decode_balance,
                                                  steps):
    """Every event keeps the core's invariants; with a live set, a paused trajectory never
    queues for a slot, and venus's rule holds after each check: every engaged engine's live
    demand (less what is marked to pause) fits its pool, or only PROMOTED programs are left to
    pause; an engine not engaged pauses nothing. Engines report their counters ("observe":
    400 tokens of context, `index` x 10 of them recomputed), so some engage and some do not.
    Decode balance moves a turn only to a lighter engine with a free slot: its load there,
    with the turn, below the one it leaves."""
    assume(live_set is None or mode != "trajectory_level")  # rejected (test below)
    c = coordinator(groups=6, group_size=2)
    ids = started(c)
    tokens = dict.fromkeys(ids, 60)  # contexts grow by a turn at each release
    core = RolloutCore(c, engines, slots, mode, live_set=live_set, kv_capacity_tokens=400,
                       context_tokens=tokens.__getitem__, buffer_tokens=10, thrash_fraction=thrash_fraction,
                       decode_balance=decode_balance)
    counters = [[0, 0] for _ in range(engines)]
    driver = Driver(core)
    for t in ids:
        core.place(t)
    ended: set[int] = set()
    for kind, index, engine, chosen in steps:
        t = ids[index]
        engine %= engines
        if kind == "request" and t not in ended and t not in core.moving and t not in driver.generating:
            asked = core.wants_demoted(t)
            if asked is not None:
                driver.apply(core.demoted(asked, {str(i) for i in chosen}))
            loads, source, balanced = list(core.decode_loads), core.engine_of[t], set(core._balanced)
            actions = core.request_slot(t)
            driver.apply(actions)
            if t in core._balanced - balanced:  # moved by decode balance
                assert actions == [Move(t, source, core.engine_of[t])] and core.slot_priority(t) < L
                assert loads[core.engine_of[t]] + tokens[t] < loads[source]
                assert core.slots[core.engine_of[t]].idle
            if mode == "priority" and core.slot_priority(t) < L and t in core.slots[core.engine_of[t]].waiting:
                slots_t = core.slots[core.engine_of[t]]
                assert all(slots_t.priorities.get(h) != L for h in slots_t.holders), "a HIGH turn waits behind a LOW"
        elif kind == "release" and t in driver.generating:
            driver.generating.discard(t)
            tokens[t] += 40 * (1 + index % 3)
            driver.apply(core.release_slot(t, now=float(len(tokens))))
        elif kind == "check" and core.live_set is not None:
            driver.apply(core.check_live_set(now=float(index)))
            if live_set == "venus":
                core.live_set.check_fits()
        elif kind == "finish" and t not in ended:
            driver.generating.discard(t)
            ended.add(t)
            driver.apply(core.finish(t))
        elif kind == "policy":
            groups = frozenset(c.trajectory(ids[i]).group_id for i in chosen)
            policy = PriorityPolicy(c.policy.version + 1, groups, frozenset(ids[i] for i in chosen if i % 3 == 0))
            c._policy = policy  # published by the coordinator
            driver.apply(core.policy_changed(policy))
        elif kind == "demoted":
            driver.apply(core.demoted(engine, {str(i) for i in chosen}))
        elif kind == "orchestrate":
            pressure = {e: (1.0 if e == engine else 0.1) for e in range(engines)}
            driver.apply(core.orchestrate(engine_loads(pressure), lambda _: 50, 0.9))
        elif kind == "arrive" and t in core.moving:
            assert core.arrived(t)
        elif kind == "observe" and engine in core.engines_to_observe():
            counters[engine][0] += 400
            counters[engine][1] += 10 * index
            core.observe_engine(engine, *counters[engine])
        core.check_invariants()
        if mode == "priority":  # an urgent turn never waits behind LOW work (`_serve_urgent`)
            for slots_e in core.slots:
                if any(slots_e.priorities[w] < L for w in slots_e.waiting):
                    assert all(slots_e.priorities.get(h) != L for h in slots_e.holders), "a HIGH turn waits behind a LOW"
        held = {h for s in core.slots for h in s.holders}
        assert driver.generating <= held, "a trajectory generates without a slot"


balance_events = st.lists(st.tuples(
    st.sampled_from(["request", "request", "request", "release", "release", "finish", "arrive", "arrive", "pressure"]),
    st.integers(0, 11), st.integers(0, 2), st.floats(0.0, 1.0),
), min_size=20, max_size=150)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 3), st.integers(1, 3), st.frozensets(st.integers(0, 11)), st.booleans(),
       st.frozensets(st.integers(0, 11), max_size=3), balance_events)
def test_decode_balance_keeps_every_invariant_and_only_lowers_a_turns_load(engines, slots, low, isolation, enders,
                                                                            steps):
    """Decode balance under any sequence of asks, releases, ends, landings and pressure
    readings (with the engines' memory stalls, grown or not), urgent and LOW turns mixed, with
    step enders isolated or not: the invariants hold after every event; a balance move takes a
    turn, once a turn, to an engine with a free slot whose decode load with the turn stays below
    the one it leaves and whose HIGH KV, with the turn, stays under BALANCE_ROOM of its pool.
    Isolation's rule: while the pool has room, no move lands where a step ender holds a slot,
    and a LOW turn moves only from beside one; without room, or off, LOW turns stay."""
    from venusrl.rollout.core import BALANCE_ROOM, ISOLATION_PRESSURE

    c = coordinator(groups=6, group_size=2)
    ids = started(c)
    tokens = {t: 50 + 40 * (t % 5) for t in ids}
    core = RolloutCore(c, engines, slots, decode_balance=True, context_tokens=tokens.__getitem__,
                       isolate_step_enders=isolation)
    low_ids = {ids[i] for i in low}
    core.declared_priority = lambda t, policy=None: L if t in low_ids else H  # type: ignore[method-assign]
    ender_ids = frozenset(ids[i] for i in enders)
    c.predicted_step_enders = lambda share: ender_ids  # type: ignore[method-assign]
    stalls = [0] * engines
    readings = with_room = 0
    driver = Driver(core)
    for t in ids:
        core.place(t)
    ended: set[int] = set()
    for kind, index, engine, fraction in steps:
        t = ids[index]
        if kind == "request" and t not in ended and t not in core.moving and t not in driver.generating:
            loads, source, pressure = list(core.decode_loads), core.engine_of[t], dict(core._pressure)
            was_balanced, isolating = t in core._balanced, isolation and core.pool_has_room
            holders = [set(s.holders) for s in core.slots]
            counted = dict(core.moves_by_reason)
            actions = core.request_slot(t)
            driver.apply(actions)
            if t in core._balanced and not was_balanced:
                target = core.engine_of[t]
                assert actions == [Move(t, source, target)]
                reason = "isolation" if isolating and t not in ender_ids and ender_ids & holders[source] else "balance"
                assert core.moves_by_reason == Counter({**counted, reason: counted.get(reason, 0) + 1})
                assert loads[target] + tokens[t] < loads[source] and core.slots[target].idle
                assert target not in pressure or pressure[target] + tokens[t] / 1000 < BALANCE_ROOM
                assert not (isolating and ender_ids & holders[target]), "a move landed beside a step ender"
                if t in low_ids:
                    assert isolating and t not in ender_ids and ender_ids & holders[source], "a LOW turn moved"
        elif kind == "release" and t in driver.generating:
            driver.generating.discard(t)
            tokens[t] += 30
            driver.apply(core.release_slot(t))
        elif kind == "finish" and t not in ended:
            driver.generating.discard(t)
            ended.add(t)
            driver.apply(core.finish(t))
        elif kind == "arrive" and t in core.moving:
            assert core.arrived(t)
        elif kind == "pressure":
            stalls[engine % engines] += index % 2  # an admission stopped for memory there, or not
            reading = engine_loads({e: fraction if e == engine % engines else 0.0 for e in range(engines)},
                                   dict(enumerate(stalls)))
            driver.apply(core.orchestrate(reading, tokens.__getitem__, 0.9))
            assert core.pool_has_room == (fraction / engines < ISOLATION_PRESSURE and index % 2 == 0)
            readings += 1
            with_room += core.pool_has_room
            assert core.room_readings == {"with_room": with_room, "all": readings}
        core.check_invariants()


def test_the_core_is_pure():
    """No torch, no asyncio behind the decisions (DESIGN.md §3): importing the core pulls in
    neither."""
    import subprocess
    import sys

    code = "import sys, venusrl.rollout.core; print(sorted({'torch', 'asyncio'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
