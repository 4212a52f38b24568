"""Slot scheduling: capacity, priority order, preemption of LOW by HIGH, baselines."""

from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.rollout.slots import SlotScheduler
from venusrl.types import Priority

H, L, P = Priority.HIGH, Priority.LOW, Priority.PROMOTED


def test_high_preempts_the_latest_low_holder():
    slots = SlotScheduler(2)
    assert slots.request("low-a", L) == (True, None)
    assert slots.request("low-b", L) == (True, None)
    assert slots.request("high", H) == (True, "low-b")
    assert set(slots.holders) == {"low-a", "high"} and "low-b" in slots.waiting


def test_a_waiter_promoted_while_waiting_holds_its_slot_and_waits_no_more():
    slots = SlotScheduler(1)
    slots.request(0, L)
    assert slots.request(1, L) == (False, None)
    assert slots.request(1, P) == (True, 0)  # the same trajectory, now at its last version
    assert set(slots.holders) == {1} and set(slots.waiting) == {0}


def test_waiting_are_granted_high_first_then_arrival_order():
    slots = SlotScheduler(1)
    slots.request("a", H)
    assert slots.request("low", L) == (False, None)
    assert slots.request("high", H) == (False, None)  # every holder is HIGH: nothing to preempt
    assert slots.release("a", finished=False) == ["high"]
    assert slots.release("high", finished=True) == ["low"]


def test_action_level_never_preempts_and_serves_in_arrival_order():
    slots = SlotScheduler(1, mode="action_level")
    slots.request("low", L)
    assert slots.request("high", H) == (False, None)
    slots.request("low2", L)
    assert slots.release("low", finished=False) == ["high"]


def test_trajectory_level_holds_the_slot_through_tool_calls():
    slots = SlotScheduler(1, mode="trajectory_level")
    slots.request("a", L)
    assert slots.request("b", H) == (False, None)
    assert slots.release("a", finished=False) == []  # a tool call: the slot stays with a
    assert slots.request("a", L) == (True, None)
    assert slots.release("a", finished=True) == ["b"]


actions = st.lists(st.tuples(st.sampled_from(["request", "release", "finish"]), st.integers(0, 7),
                             st.sampled_from([P, H, L])), max_size=80)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.sampled_from(["priority", "action_level", "trajectory_level"]), actions)
def test_invariants(capacity, mode, steps):
    slots = SlotScheduler(capacity, mode=mode)
    for action, t, priority in steps:
        if action == "request":
            slots.request(t, priority)
        else:
            slots.release(t, finished=action == "finish")
        assert len(slots.holders) <= capacity
        assert not set(slots.holders) & set(slots.waiting)
        if slots.waiting:
            assert len(slots.holders) == capacity, "a slot idles while someone waits"
        if mode == "priority" and action == "request" and priority < L and t in slots.waiting:
            # an urgent request waits only when no LOW holds a slot it could take
            assert all(slots.priorities.get(h) != L for h in slots.holders)


def test_critical_order_ranks_high_waiters_before_their_arrival_and_leaves_low_alone():
    order = {"long": -30.0, "short": -5.0, "low-late": -99.0, "low-early": 0.0}
    slots = SlotScheduler(1, critical_order=order.__getitem__)
    slots.request("holder", H)
    for name, priority in (("short", H), ("low-early", L), ("long", H), ("low-late", L)):
        assert slots.request(name, priority) == (False, None)
    granted = [slots.release(holder, finished=True)[0] for holder in ("holder", "long", "short", "low-early")]
    assert granted == ["long", "short", "low-early", "low-late"]  # LOW stays in arrival order


def test_an_idle_engine_takes_the_last_waiter_of_the_busiest_engine():
    from venusrl.rollout.slots import steal_candidate

    busy, busier, idle = (SlotScheduler(1, "priority") for _ in range(3))
    busy.request("a", Priority.LOW)
    busy.request("b", Priority.LOW)  # waits
    busier.request("c", Priority.LOW)
    busier.request("d", Priority.LOW)  # waits
    busier.request("e", Priority.HIGH)  # preempts c, which queues again behind d
    assert set(busier.holders) == {"e"} and busier.next_waiter() == "d" and busier.last_waiter() == "c"
    engines = [busy, busier, idle]
    assert idle.idle and not busy.idle
    # the engine with the most waiters, and there the turn it would serve last
    assert steal_candidate(engines, target=2) == (1, "c")
    assert steal_candidate(engines, target=2, excluded={"c"}) == (1, "d")  # c is already on its way
    assert steal_candidate(engines, target=2, excluded={"c", "d"}) == (0, "b")
    assert steal_candidate(engines, target=2, pays=lambda source: source is busy) == (0, "b")
    assert steal_candidate(engines, target=0) is None  # engine 0 has a waiter of its own: not idle
    idle.request("f", Priority.LOW)
    assert steal_candidate(engines, target=2) is None  # its one slot is taken now
