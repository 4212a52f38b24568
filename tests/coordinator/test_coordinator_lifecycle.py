"""Group lifecycle, window, staleness and policy publication, event by event."""

import math

import pytest
from tests.coordinator.coord_harness import Ledger, Record, config, prompts

from venusrl.coordinator import DataCoordinator
from venusrl.coordinator.policies import LengthPredictionRule
from venusrl.types import GroupStatus, Priority, TrajectoryStatus


def run_turn(ledger, tid, now, n_tokens, version=0, tool_call=False):
    c = ledger.c
    ledger.apply(c.on_turn_start(tid, now, [1, 2, 3]))
    ledger.records[tid].context([1, 2, 3])
    ledger.records[tid].generated(list(range(n_tokens)), [-0.5] * n_tokens)
    return ledger.apply(c.on_turn_end(tid, now + 1, list(range(n_tokens)), [-0.5] * n_tokens, version, tool_call))


def test_start_admits_the_window_of_groups():
    c = DataCoordinator(config(batch_groups=4, group_size=3, async_factor=1.5), prompts(20))
    out = Ledger(c).apply(c.start(0.0))
    assert c.window == 6
    assert len(out.start) == 18
    assert c.in_flight == 6
    assert out.policy is not None and len(out.policy.high_groups) == 4


def test_group_ready_only_when_all_done_and_window_refills_after_a_weight_step():
    c = DataCoordinator(config(), prompts(10))
    ledger = Ledger(c)
    first = ledger.apply(c.start(0.0)).start
    a, b = (t for t in first if t.group_id == first[0].group_id)
    run_turn(ledger, a.id, 1.0, 5)
    assert not ledger.done(a.id, 3.0).ready
    run_turn(ledger, b.id, 1.0, 7)
    out = ledger.done(b.id, 4.0)
    assert [g.prompt.id for g in out.ready] == ["p0"]
    group = out.ready[0]
    # the rollout side's record, adopted whole with the done event; the turns are the counts
    assert group.trajectories[1].token_ids == [1, 2, 3, *range(7)]
    assert group.trajectories[1].generated_mask == [False] * 3 + [True] * 7
    assert group.trajectories[1].logprobs == [0.0] * 3 + [-0.5] * 7
    assert group.trajectories[1].turns[0].weight_version == 0
    assert (group.trajectories[1].turns[0].context_tokens, group.trajectories[1].generated_tokens) == (3, 7)
    # The ready group still occupies the window until a weight step consumes it.
    assert c.in_flight == c.window and not out.start
    out = ledger.apply(c.on_weight_version(1, 5.0))
    assert group.status is GroupStatus.TRAINED
    assert len(out.start) == 2 and c.in_flight == c.window
    summary = c.summary()
    assert summary["weight_version"] == 1 and summary["trained"] == 1 and summary["admitted"] == 4
    assert summary["in_flight"] == summary["running"] == 3


def test_trajectory_past_its_span_is_rerun_and_last_version_promoted():
    c = DataCoordinator(config(max_version_span=2), prompts(10))
    ledger = Ledger(c)
    started = ledger.apply(c.start(0.0)).start
    old = started[0]
    out = ledger.apply(c.on_weight_version(1, 1.0))
    assert old.id not in c.policy.promoted
    # Later groups admitted at version 1 refill nothing (window full); version 2 promotes.
    out = ledger.apply(c.on_weight_version(2, 2.0))
    assert out.policy is not None and old.id in out.policy.promoted
    assert c.policy.priority(old.group_id, old.id) is Priority.PROMOTED
    out = ledger.apply(c.on_weight_version(3, 3.0))
    assert old.id in out.discarded and old.status is TrajectoryStatus.DISCARDED
    rerun = next(t for t in out.start if t.group_id == old.group_id and t.index == old.index)
    assert rerun.attempt == 1 and rerun.start_version == 3
    assert old.id not in c.policy.promoted


def test_turn_generated_by_too_new_weights_is_discarded():
    c = DataCoordinator(config(max_version_span=1), prompts(4))
    ledger = Ledger(c)
    t = ledger.apply(c.start(0.0)).start[0]
    out = run_turn(ledger, t.id, 0.0, 4, version=2)
    assert out.discarded == [t.id]
    assert [n.index for n in out.start] == [t.index]
    assert c.stale_discard_tokens == [4]  # the length it had reached, for the long-tail discard rate


def test_only_stale_discards_are_recorded_with_their_length():
    c = DataCoordinator(config(max_version_span=0), prompts(4))
    ledger = Ledger(c)
    first, second = ledger.apply(c.start(0.0)).start[:2]
    run_turn(ledger, first.id, 0.0, 7, version=0)
    ledger.apply(c.on_trajectory_failed(second.id, 1.0, "sandbox lost"))
    assert c.stale_discard_tokens == []
    ledger.apply(c.on_weight_version(1, 2.0))
    assert 7 in c.stale_discard_tokens and all(n in (0, 7) for n in c.stale_discard_tokens)


def test_prompt_dropped_after_max_reruns_and_reported():
    c = DataCoordinator(config(max_reruns=1), prompts(4))
    ledger = Ledger(c)
    t = ledger.apply(c.start(0.0)).start[0]
    out = ledger.apply(c.on_trajectory_failed(t.id, 1.0, "sandbox lost"))
    second = out.start[0]
    out = ledger.apply(c.on_trajectory_failed(second.id, 2.0, "sandbox lost"))
    assert [p.id for p in out.dropped] == [t.prompt.id]
    assert second.id in out.discarded
    assert c.counts.dropped == 1
    # The drop freed a window place: a new prompt was admitted at once.
    assert {s.prompt.id for s in out.start} == {"p3"}


def test_late_events_for_discarded_trajectories_are_ignored():
    c = DataCoordinator(config(), prompts(4))
    ledger = Ledger(c)
    t = ledger.apply(c.start(0.0)).start[0]
    ledger.apply(c.on_trajectory_failed(t.id, 1.0, "x"))
    assert not c.on_prediction(t.id, 2.0, 10.0, 0)
    assert not c.on_turn_end(t.id, 2.0, [1], [0.0], 0, False)
    assert not c.on_trajectory_done(t.id, 2.0, 1.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c, t: c.on_turn_end(t, 1.0, [1, 2], [0.0], 0, False), "logprobs has 1 entries, token_ids has 2"),
        (lambda c, t: c.on_tool_result(t, 1.0), "expected in_tool"),
        (lambda c, t: c.on_prediction(t, 1.0, -1.0, 0), "remaining_tokens must be >= 0"),
        (lambda c, t: c.on_prediction(t, 1.0, math.nan, 0), "remaining_tokens must be >= 0"),
        (lambda c, t: c.on_prediction(t, 1.0, 5.0, 3), "at_generated_tokens 3 > generated so far 0"),
        (lambda c, t: c.on_turn_start(999, 1.0), "trajectory 999 was never handed out"),
        (lambda c, t: c.on_weight_version(-1, 1.0), "older than the current 0"),
    ],
)
def test_bad_events_name_the_problem(call, message):
    c = DataCoordinator(config(), prompts(4))
    t = c.start(0.0).start[0]
    with pytest.raises(ValueError, match=message):
        call(c, t.id)


def test_dataset_items_must_be_prompts():
    c = DataCoordinator(config(), iter([{"prompt": "x"}]))
    with pytest.raises(TypeError, match="dataset yielded dict"):
        c.start(0.0)


def test_tool_timing_and_errors_recorded():
    c = DataCoordinator(config(), prompts(4))
    ledger = Ledger(c)
    t = ledger.apply(c.start(0.0)).start[0]
    run_turn(ledger, t.id, 0.0, 4, tool_call=True)
    assert t.status is TrajectoryStatus.IN_TOOL
    with pytest.raises(ValueError, match="still in_tool"):
        c.on_trajectory_done(t.id, 2.0, 0.0)
    ledger.apply(c.on_tool_result(t.id, 4.0, error=True))
    assert t.turns[0].tool_seconds == pytest.approx(3.0) and t.tool_errors == 1
    assert t.status is TrajectoryStatus.WAITING


def test_policy_republished_only_when_the_high_set_changes():
    c = DataCoordinator(config(batch_groups=2, group_size=2, async_factor=2.0, policy="fcfs"), prompts(10))
    ledger = Ledger(c)
    out = ledger.apply(c.start(0.0))
    assert out.policy.high_groups == {0, 1}
    t = out.start[0]
    # FCFS keys never move: turns and predictions change nothing.
    assert run_turn(ledger, t.id, 1.0, 3).policy is None
    assert ledger.apply(c.on_prediction(t.id, 2.0, 100.0, 3)).policy is None
    # A finished group shrinks B - R: one HIGH group left.
    group0 = [s for s in out.start if s.group_id == 0]
    ledger.done(group0[0].id, 3.0)
    final = ledger.done(group0[1].id, 3.0)
    assert final.policy is not None and final.policy.high_groups == {1}


def test_length_prediction_marks_the_shortest_groups_high():
    c = DataCoordinator(config(batch_groups=2, group_size=2, async_factor=2.0), prompts(10))
    ledger = Ledger(c)
    started = ledger.apply(c.start(0.0)).start
    remaining = {0: 900.0, 1: 50.0, 2: 40.0, 3: 5000.0}
    for t in started:
        ledger.apply(c.on_prediction(t.id, 1.0, remaining[t.group_id] * (1 + t.index), 0))
    assert c.policy.high_groups == {1, 2}
    assert c.ranked_group_ids() == [2, 1, 0, 3]
    # Group 2's long trajectory turns out much longer: group 0 overtakes it.
    long_one = next(t for t in started if t.group_id == 2 and t.index == 1)
    ledger.apply(c.on_prediction(long_one.id, 2.0, 3000.0, 0))
    assert c.policy.high_groups == {0, 1}


def test_a_group_waiting_for_slots_does_not_climb_the_ranking_by_waiting():
    """Group 0 has the most work left and waits (no events) while group 1 takes slow turns:
    time passes and the measured cost per token grows, yet group 1 stays the critical one."""
    c = DataCoordinator(config(batch_groups=1, group_size=1, async_factor=2.0), prompts(4))
    ledger = Ledger(c)
    waiting, working = ledger.apply(c.start(0.0)).start
    ledger.apply(c.on_prediction(waiting.id, 0.0, 400.0, 0))
    ledger.apply(c.on_prediction(working.id, 0.0, 300.0, 0))
    assert c.policy.high_groups == {working.group_id}
    seconds_per_token = c.stats.seconds_per_token
    now, generated = 0.0, 0
    for _ in range(8):
        ledger.apply(c.on_turn_start(working.id, now, [1]))
        now += 5.0  # a 20-token turn that spent most of its time waiting for a slot
        generated += 20
        ledger.apply(c.on_turn_end(working.id, now, list(range(20)), [-0.5] * 20, 0, tool_call=False))
        assert c.policy.high_groups == {working.group_id}, f"after {generated} tokens at t={now}"
    assert c.stats.seconds_per_token > 2 * seconds_per_token


def test_group_key_is_the_max_over_unfinished_trajectories():
    c = DataCoordinator(config(group_size=3), prompts(2))
    assert c.running_groups() == []  # nothing is admitted before start
    c.start(0.0)
    group = c.running_groups()[0]
    rule = LengthPredictionRule()
    for t, rem in zip(group.trajectories, (10.0, 500.0, 20.0), strict=True):
        t.predicted_remaining = rem
    cost = LengthPredictionRule.cost_per_token(c.stats)
    expected = max(rule.time_to_finish(t, 0.0, c.stats) for t in group.trajectories) / cost
    assert rule.group_key(group, 0.0, c.stats) == pytest.approx(expected)
    group.trajectories[1].status = TrajectoryStatus.DONE
    assert rule.group_key(group, 0.0, c.stats) < expected


def test_in_tool_trajectory_resumes_after_the_expected_tool_time():
    c = DataCoordinator(config(prior_tool_seconds=10.0), prompts(2))
    c.start(0.0)
    t = c.running_groups()[0].trajectories[0]
    t.predicted_remaining = 0.0
    rule = LengthPredictionRule()
    assert rule.time_to_finish(t, 0.0, c.stats) == 0.0
    t.status = TrajectoryStatus.IN_TOOL
    t.tool_started_at = 0.0
    assert rule.time_to_finish(t, 4.0, c.stats) == pytest.approx(6.0)


def test_action_level_marks_nothing_high_and_oracle_needs_true_lengths():
    c = DataCoordinator(config(policy="action_level"), prompts(4))
    assert c.start(0.0).policy is None and c.policy.high_groups == frozenset()
    with pytest.raises(ValueError, match="needs true_remaining"):
        DataCoordinator(config(policy="oracle"), prompts(4))


@pytest.mark.parametrize(("record", "message"), [
    (Record([1, 2], [0, 1], [0.0]), "differ in length"),
    (Record([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0]), "marks 2 tokens, its turns generated 1"),
])
def test_a_record_that_disagrees_with_the_turns_is_refused_with_the_field(record, message):
    c = DataCoordinator(config(), prompts(4))
    t = c.start(0.0).start[0]
    c.on_turn_start(t.id, 0.0, [1])
    c.on_turn_end(t.id, 1.0, [2], [-1.0], 0, tool_call=False)
    with pytest.raises(ValueError, match=message):
        c.on_trajectory_done(t.id, 2.0, 1.0, record=record)
    assert c.trajectory(t.id) is not None, "a refused done event changes nothing"
    c.on_trajectory_done(t.id, 2.0, 1.0, record=Record([1, 2], [0, 1], [0.0, -1.0]))
    assert c.trajectory(t.id) is None
