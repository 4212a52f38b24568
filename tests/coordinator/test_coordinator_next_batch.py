"""With R >= B ready groups waiting for the trainer, the coordinator ranks the batch after
them: B - (R mod B) groups are HIGH while the trainer steps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.coordinator.coord_harness import config, prompts

from venusrl.coordinator import DataCoordinator, make_rule


def _started(batch_groups: int, window_factor: float, remaining: list[float]):
    coordinator = DataCoordinator(config(policy="length_prediction", group_size=1, batch_groups=batch_groups,
                                         async_factor=window_factor), prompts(20))
    started = coordinator.start(now=0.0).start
    for t, tokens in zip(started, remaining, strict=True):
        coordinator.on_turn_start(t.id, now=0.0)
        coordinator.on_prediction(t.id, now=0.1, remaining_tokens=tokens, at_generated_tokens=0)
    return coordinator, started


def test_when_a_full_batch_waits_for_the_trainer_the_next_batch_is_ranked():
    # B = 2, window 5: groups 0 and 1 finish first; of 2, 3, 4 the two with least work left are HIGH
    coordinator, (a, b, c, d, e) = _started(2, 2.5, [10.0, 20.0, 500.0, 50.0, 90.0])
    for t in (a, b):
        coordinator.on_turn_end(t.id, now=1.0, token_ids=[1], logprobs=[-0.1], weight_version=0, tool_call=False)
        coordinator.on_trajectory_done(t.id, now=1.0, reward=1.0)
    assert coordinator.ready_waiting == 2
    assert coordinator.policy.high_groups == {d.group_id, e.group_id}
    # one more done (R = 3): the step after the trainer's needs one more group, the shortest
    coordinator.on_turn_end(d.id, now=2.0, token_ids=[1], logprobs=[-0.1], weight_version=0, tool_call=False)
    coordinator.on_trajectory_done(d.id, now=2.0, reward=1.0)
    assert coordinator.policy.high_groups == {e.group_id}
    # the trainer consumes one batch: R = 1, the window refills, B - 1 groups are needed
    coordinator.on_weight_version(1, now=3.0)
    assert coordinator.ready_waiting == 1 and len(coordinator.policy.high_groups) == 1


@given(st.integers(1, 64), st.integers(0, 300))
def test_the_critical_count_is_what_the_next_unfilled_batch_still_needs(batch, ready):
    k = make_rule("length_prediction").critical_count(batch, ready)
    assert 1 <= k <= batch and (ready + k) % batch == 0
    assert make_rule("action_level").critical_count(batch, ready) == 0


def test_a_policy_change_touches_the_trajectories_of_groups_that_changed_side():
    coordinator, (a, b, c, d, e) = _started(2, 2.5, [10.0, 20.0, 500.0, 50.0, 90.0])
    before = coordinator.policy
    assert before.high_groups == {a.group_id, b.group_id}
    coordinator.on_turn_end(a.id, now=1.0, token_ids=[1], logprobs=[-0.1], weight_version=0, tool_call=False)
    coordinator.on_trajectory_done(a.id, now=1.0, reward=1.0)  # R = 1: b stays HIGH, one slot left
    after = coordinator.policy
    assert after.high_groups == {b.group_id}
    assert coordinator.touched_by(after, before) == set()  # a's group left the running set: nothing to tell
    coordinator.on_prediction(c.id, now=1.5, remaining_tokens=1.0, at_generated_tokens=0)  # c is now the shortest
    assert coordinator.policy.high_groups == {c.group_id}
    assert coordinator.touched_by(coordinator.policy, after) == {b.id, c.id}
