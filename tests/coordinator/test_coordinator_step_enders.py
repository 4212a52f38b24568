"""The predicted step enders: the trajectories of the HIGH group ranked last with the most work left."""

from __future__ import annotations

from tests.coordinator.coord_harness import config, prompts

from venusrl.coordinator import DataCoordinator

# the remaining tokens each group's three trajectories are predicted to have
PREDICTED = ((100.0, 100.0, 100.0), (900.0, 500.0, 300.0), (50.0, 50.0, 50.0))


def _predicted(policy: str) -> tuple[DataCoordinator, dict[int, list[int]]]:
    coordinator = DataCoordinator(config(policy=policy, group_size=3, batch_groups=3, async_factor=1.0), prompts(3))
    started = coordinator.start(now=0.0).start
    groups = sorted({t.group_id for t in started})
    ids = {g: [t.id for t in started if t.group_id == g] for g in groups}
    for g, predicted in zip(groups, PREDICTED, strict=True):
        for t, remaining in zip(ids[g], predicted, strict=True):
            coordinator.on_turn_start(t, now=0.0)
            coordinator.on_prediction(t, now=0.1, remaining_tokens=remaining, at_generated_tokens=0)
    return coordinator, ids


def test_the_last_ranked_high_groups_trajectories_with_at_least_the_share_of_its_most_work_left():
    coordinator, ids = _predicted("length_prediction")
    slow = sorted(ids)[1]
    assert coordinator.policy.high_groups == frozenset(ids)
    assert coordinator.ranked_group_ids()[-1] == slow  # predicted to be ready last
    assert coordinator.predicted_step_enders(0.5) == frozenset(ids[slow][:2])  # 900 and 500; 300 < 450
    assert coordinator.predicted_step_enders(0.3) == frozenset(ids[slow])
    assert coordinator.predicted_step_enders(1.0) == frozenset(ids[slow][:1])


def test_a_finished_trajectory_is_no_step_ender():
    coordinator, ids = _predicted("length_prediction")
    slow = sorted(ids)[1]
    longest = ids[slow][0]
    coordinator.on_turn_end(longest, now=1.0, token_ids=[1, 2], logprobs=[0.0, 0.0], weight_version=0, tool_call=False)
    coordinator.on_trajectory_done(longest, now=1.0, reward=0.0)
    assert longest not in coordinator.predicted_step_enders(0.5)


def test_a_rule_that_predicts_no_lengths_has_no_step_enders():
    coordinator, _ = _predicted("fcfs")
    assert coordinator.predicted_step_enders(0.5) == frozenset()
