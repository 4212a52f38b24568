from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.sim.events import EventLoop


@given(st.lists(st.tuples(st.floats(0, 100), st.lists(st.floats(0, 10), max_size=3)), max_size=40))
def test_clock_never_goes_backwards_and_every_event_runs_once(plan):
    loop = EventLoop()
    seen: list[float] = []
    ran: list[int] = []

    def make(index: int, delays: list[float]):
        def callback():
            seen.append(loop.now)
            ran.append(index)
            for d in delays:  # events scheduled from events, never in the past
                loop.after(d, lambda: seen.append(loop.now))
        return callback

    for index, (at, delays) in enumerate(plan):
        loop.at(at, make(index, delays))
    loop.run()
    assert seen == sorted(seen)
    assert sorted(ran) == list(range(len(plan)))
    assert loop.pending == 0


def test_same_time_events_run_in_scheduling_order_and_cancelled_ones_are_skipped():
    loop = EventLoop()
    order: list[str] = []
    loop.at(1.0, lambda: order.append("a"))
    cancelled = loop.at(1.0, lambda: order.append("x"))
    loop.at(1.0, lambda: order.append("b"))
    cancelled.cancel()
    loop.run()
    assert order == ["a", "b"]
    with pytest.raises(ValueError):
        loop.at(0.5, lambda: None)


def test_run_stops_at_until_and_on_stop():
    loop = EventLoop()
    order: list[float] = []
    for t in (1.0, 2.0, 3.0):
        loop.at(t, lambda: order.append(loop.now))
    loop.run(until=2.0)
    assert order == [1.0, 2.0] and loop.now == 2.0
    loop.at(4.0, loop.stop)
    loop.at(4.0, lambda: order.append(-1.0))
    loop.run()
    assert order == [1.0, 2.0, 3.0]
