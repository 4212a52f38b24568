"""The critical_path rule serves the critical set longest-first; the paper's rule does not order it."""

from __future__ import annotations

from tests.coordinator.coord_harness import config, prompts

from venusrl.coordinator import DataCoordinator


def _predicted(policy: str) -> tuple[DataCoordinator, list[int]]:
    coordinator = DataCoordinator(config(policy=policy, batch_groups=2, async_factor=1.0), prompts(4))
    started = coordinator.start(now=0.0).start
    groups = sorted({t.group_id for t in started})
    remaining = dict(zip(groups, (100.0, 900.0), strict=True))  # the second group has the most work left
    for t in started:
        coordinator.on_turn_start(t.id, now=0.0)
        coordinator.on_prediction(t.id, now=0.1, remaining_tokens=remaining[t.group_id], at_generated_tokens=0)
    return coordinator, [next(t.id for t in started if t.group_id == g) for g in groups]


def test_critical_path_puts_the_group_with_most_work_left_first():
    coordinator, (short, long) = _predicted("critical_path")
    assert coordinator.critical_order(long) < coordinator.critical_order(short) < 0
    assert coordinator.policy.high_groups == frozenset({coordinator.trajectory(short).group_id,
                                                        coordinator.trajectory(long).group_id})
    assert coordinator.critical_order(10_000) == 0.0  # not a live trajectory


def test_the_papers_rule_leaves_the_critical_set_in_arrival_order():
    coordinator, ids = _predicted("length_prediction")
    assert [coordinator.critical_order(i) for i in ids] == [0.0, 0.0]
