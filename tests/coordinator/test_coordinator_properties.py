"""Invariants of the coordinator under arbitrary event orders (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.coordinator.coord_harness import Ledger, config, prompts

from venusrl.coordinator import DataCoordinator, make_rule
from venusrl.types import Priority, TrajectoryStatus

ACTIONS = ("turn", "tool_call", "tool_result", "predict", "done", "fail", "step", "late")

settings.register_profile("coordinator", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_invariants(c: DataCoordinator, ledger: Ledger) -> None:
    assert c.in_flight <= c.window
    span = c.config.max_version_span
    policy = c.policy
    running = {g.id for g in c.running_groups()}
    assert policy.high_groups <= running
    k = c.rule.critical_count(c.config.batch_groups, c.ready_waiting)
    assert len(policy.high_groups) == min(k, len(running))
    assert policy.high_groups == set(c.ranked_group_ids()[:k])
    at_boundary = set()
    for group in c.running_groups():
        assert not group.all_done
        for t in group.trajectories:
            if t.finished:
                continue
            assert c.weight_version - t.start_version <= span, "a live trajectory spans too many versions"
            if c.weight_version - t.start_version == span and c.config.promote_at_boundary:
                at_boundary.add((group.id, t.id))
    assert {tid for _, tid in at_boundary} == policy.promoted
    others = [
        policy.priority(g.id, t.id)
        for g in c.running_groups()
        for t in g.trajectories
        if not t.finished and (g.id, t.id) not in at_boundary
    ]
    for gid, tid in at_boundary:
        assert policy.priority(gid, tid) is Priority.PROMOTED
        assert all(policy.priority(gid, tid) < p for p in others)
    # The workers' view of live trajectories matches the coordinator's.
    assert set(ledger.live) == {t.id for g in c.running_groups() for t in g.trajectories if not t.finished}


def drain(c: DataCoordinator, ledger: Ledger, now: float) -> None:
    """Finish everything: complete each live trajectory, step weights as groups come in."""
    for _ in range(10_000):
        if c.finished and c.ready_waiting == 0:
            return
        now += 1.0
        if ledger.live:
            tid = min(ledger.live)
            t = c.trajectory(tid)
            if t.status is TrajectoryStatus.IN_TOOL:
                ledger.apply(c.on_tool_result(tid, now))
            ledger.done(tid, now)
        else:
            ledger.apply(c.on_weight_version(c.weight_version + 1, now))
        check_invariants(c, ledger)
    raise AssertionError("did not drain")


@settings.get_profile("coordinator")
@given(
    data=st.data(),
    group_size=st.integers(1, 4),
    batch_groups=st.integers(1, 4),
    async_factor=st.sampled_from([1.0, 1.5, 2.0]),
    span=st.integers(0, 3),
    policy=st.sampled_from(["fcfs", "action_level", "length_prediction", "oracle"]),
    max_reruns=st.integers(0, 2),
    n_prompts=st.integers(1, 12),
)
def test_any_event_order_keeps_every_invariant(
    data, group_size, batch_groups, async_factor, span, policy, max_reruns, n_prompts
):
    cfg = config(
        group_size=group_size, batch_groups=batch_groups, async_factor=async_factor,
        max_version_span=span, policy=policy, max_reruns=max_reruns,
    )
    rule = make_rule(policy, true_remaining=lambda t: (t.id * 37) % 101) if policy == "oracle" else None
    dataset = prompts(n_prompts)
    c = DataCoordinator(cfg, dataset, rule=rule)
    ledger = Ledger(c)
    ledger.apply(c.start(0.0))
    check_invariants(c, ledger)
    now = 0.0
    for _ in range(data.draw(st.integers(0, 80), label="events")):
        now += data.draw(st.floats(0.0, 5.0), label="dt")
        action = data.draw(st.sampled_from(ACTIONS), label="action")
        if action == "step":
            ledger.apply(c.on_weight_version(c.weight_version + data.draw(st.integers(1, 2)), now))
        elif action == "late" and ledger.discarded:
            assert not c.on_prediction(min(ledger.discarded), now, 1.0, 0)
        elif ledger.live:
            tid = data.draw(st.sampled_from(sorted(ledger.live)), label="trajectory")
            t = c.trajectory(tid)
            if action in ("turn", "tool_call") and t.status is not TrajectoryStatus.IN_TOOL:
                if t.status is TrajectoryStatus.WAITING:
                    ledger.apply(c.on_turn_start(tid, now, [7]))
                n = data.draw(st.integers(0, 5))
                version = c.weight_version - data.draw(st.integers(0, 1))
                ledger.apply(c.on_turn_end(tid, now, [1] * n, [-1.0] * n, version, action == "tool_call"))
            elif action == "tool_result" and t.status is TrajectoryStatus.IN_TOOL:
                ledger.apply(c.on_tool_result(tid, now, error=data.draw(st.booleans())))
            elif action == "predict":
                ledger.apply(c.on_prediction(tid, now, data.draw(st.floats(0, 1e4)), t.generated_tokens))
            elif action == "done" and t.status is not TrajectoryStatus.IN_TOOL:
                ledger.done(tid, now, reward=data.draw(st.floats(-1, 1)))
            elif action == "fail":
                ledger.apply(c.on_trajectory_failed(tid, now, "test"))
        check_invariants(c, ledger)
    drain(c, ledger, now)
    # Every prompt trained exactly once or reported dropped exactly once; none lost.
    for p in dataset:
        assert ledger.ready[p.id] + ledger.dropped[p.id] == 1, p.id
    assert c.counts.admitted == n_prompts
    assert c.counts.trained + c.counts.dropped == n_prompts
