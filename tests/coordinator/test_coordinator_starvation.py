"""Appendix C: a long LOW trajectory is not starved by a stream of short HIGH ones.

A tick-level model of the rollout: S generation slots, strict priority (PROMOTED, HIGH, LOW;
preemptive, partial rollouts keep their tokens), one token per slot per tick, and a trainer
that steps when B groups are ready but at most once per `step_ticks` (a training step takes
time). One prompt has a trajectory of L tokens, predicted exactly, so it ranks last; every
other trajectory has l tokens. With L <= step_ticks, a trajectory promoted at its last
admissible version finishes before the next version, so it is never discarded.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.coordinator.coord_harness import Ledger, config

from venusrl.coordinator import DataCoordinator
from venusrl.types import Priority, Prompt, TrajectoryStatus


def run_stream(*, K, B, S, span, short, long, step_ticks, promote=True, n_short=300, max_ticks=20_000):
    dataset = [Prompt("long", ())] + [Prompt(f"s{i}", ()) for i in range(n_short)]
    c = DataCoordinator(
        config(group_size=K, batch_groups=B, max_version_span=span, promote_at_boundary=promote, max_reruns=1000),
        dataset,
    )
    ledger = Ledger(c)
    length: dict[int, int] = {}
    progress: dict[int, int] = {}
    trained_before_long = 0
    long_discards = 0
    low_ticks_of_long = 0

    def apply(out, now):
        nonlocal long_discards
        ledger.apply(out)
        long_discards += sum(1 for tid in out.discarded if tid in length and length[tid] == long and long != short)
        for t in out.start:
            length[t.id] = long if (t.prompt.id == "long" and t.index == 0) else short
            progress[t.id] = 0
            ledger.apply(c.on_prediction(t.id, now, float(length[t.id]), 0))

    apply(c.start(0.0), 0.0)
    last_step = 0
    for tick in range(1, max_ticks):
        now = float(tick)
        policy = c.policy
        live = sorted(ledger.live, key=lambda tid: (policy.priority(ledger.live[tid], tid), tid))
        for tid in live[:S]:
            t = c.trajectory(tid)
            if t is None:  # discarded by an earlier decision in this tick
                continue
            if length[tid] == long and policy.priority(t.group_id, tid) is Priority.LOW:
                low_ticks_of_long += 1
            if t.status is TrajectoryStatus.WAITING:
                apply(c.on_turn_start(tid, now), now)
            progress[tid] += 1
            if progress[tid] == length[tid]:
                apply(c.on_turn_end(tid, now, [0] * length[tid], [0.0] * length[tid], c.weight_version, False), now)
                if c.trajectory(tid) is not None:
                    apply(c.on_trajectory_done(tid, now, 0.0), now)
                    ledger.live.pop(tid, None)
        if ledger.ready["long"] or ledger.dropped["long"]:
            return {"done_tick": tick, "discards": long_discards, "trained_before": trained_before_long,
                    "versions": c.weight_version}
        if c.ready_waiting >= B and tick - last_step >= step_ticks:
            trained_before_long += min(B, c.ready_waiting)
            apply(c.on_weight_version(c.weight_version + 1, now), now)
            last_step = tick
    return {"done_tick": None, "discards": long_discards, "trained_before": trained_before_long,
            "versions": c.weight_version}


@settings(max_examples=25, deadline=None)
@given(
    K=st.integers(1, 4), B=st.integers(1, 4), S=st.integers(1, 6), span=st.integers(0, 2),
    short=st.integers(1, 4), long_factor=st.integers(2, 10), data=st.data(),
)
def test_long_low_trajectory_completes_without_discard(K, B, S, span, short, long_factor, data):
    long = short * long_factor
    step_ticks = data.draw(st.integers(long, 2 * long), label="step_ticks")
    result = run_stream(K=K, B=B, S=S, span=span, short=short, long=long, step_ticks=step_ticks)
    assert result["done_tick"] is not None, result
    assert result["discards"] == 0, result
    # It finishes within its admissible versions: at most span + 1 steps of B groups pass it.
    assert result["versions"] <= span + 1
    assert result["trained_before"] <= (span + 1) * B


def test_without_promotion_the_same_stream_discards_it():
    """The contrast case: with promotion off, saturated HIGH slots push the long trajectory
    past its span, it is discarded and re-run, and more groups overtake it."""
    args = {"K": 4, "B": 4, "S": 4, "span": 1, "short": 2, "long": 12, "step_ticks": 12, "n_short": 80}
    starved = run_stream(promote=False, **args)
    promoted = run_stream(promote=True, **args)
    assert starved["discards"] >= 1
    assert promoted["discards"] == 0
    assert promoted["done_tick"] < starved["done_tick"]
    assert promoted["trained_before"] < starved["trained_before"]
