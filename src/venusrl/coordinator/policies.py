"""Priority rules: which unfinished groups are critical (HIGH) for the next optimizer step.

A rule gives each unfinished group a key (ascending: more urgent) and says how many of the
first groups to mark HIGH. The coordinator keeps groups sorted by key, re-keying a group only
when one of its trajectories has an event, so a key must stay valid while its group is
untouched: a sequence number, or remaining work (never an absolute time, which a waiting
group would keep while the others' moved on).

To add a rule: subclass `PriorityRule`, give it a `name`, register it in `RULES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from venusrl.coordinator.stats import RunningStats
from venusrl.types import Group, Trajectory, TrajectoryStatus


class PriorityRule:
    """Base rule: groups in arrival order, the first B - (R mod B) of them HIGH (this is FCFS).

    R ready groups wait for the trainer. While R < B that is the B - R groups the next step
    still needs (§4.2). Once R >= B the trainer is busy with full batches and the step after
    them needs B - (R mod B) more: the next batch is ranked and pushed while the trainer
    steps, instead of running unprioritised (no group HIGH) until the weights advance.
    """

    name: ClassVar[str] = "fcfs"
    # Whether slots inside the HIGH set go to the group with the largest key first (see
    # CriticalPathRule) instead of in arrival order.
    longest_critical_first: ClassVar[bool] = False

    def critical_count(self, needed: int, ready: int) -> int:
        """needed = B groups per step, ready = R groups done and waiting for the trainer."""
        return needed - ready % needed

    def group_key(self, group: Group, now: float, stats: RunningStats) -> float:
        return float(group.seq)


class FcfsRule(PriorityRule):
    name = "fcfs"


class ActionLevelRule(PriorityRule):
    """No group priority: every trajectory is LOW and the worker schedules actions alone."""

    name = "action_level"

    def critical_count(self, needed: int, ready: int) -> int:
        return 0


class LengthPredictionRule(PriorityRule):
    """The paper's rule (§4.2): rank groups by predicted time to completion.

        T_complete(g) = max over unfinished r in g of
                        resume_in(r)
                        + predicted_remaining_tokens(r) * seconds_per_token
                        + expected_tool_seconds(r)

    resume_in(r) = what is left of a running tool call,
    expected_tool_seconds(r) = predicted_remaining_turns(r) * tool_seconds,
    predicted_remaining_turns(r) = predicted_remaining_tokens(r) / tokens_per_turn.

    The key is T_complete(g) / cost_per_token: the time to completion in units of the
    current cost of one remaining token (seconds_per_token + tool_seconds / tokens_per_turn).
    A group is re-keyed only when one of its trajectories has an event, so its key must stay
    comparable with keys computed later. An absolute time `now + T_complete` does not: a
    group waiting for a slot keeps an early finish time while the others' move on, and so
    climbs the ranking by waiting (priority inversion toward long groups). Nor does a plain
    T_complete: the cost estimates drift as turns are measured (under contention a turn's
    time includes its wait for a slot), and an untouched group would keep the old, lower cost.
    Divided by cost_per_token, only the running tool call (at most one turn's worth) depends
    on the estimates.
    """

    name = "length_prediction"

    def group_key(self, group: Group, now: float, stats: RunningStats) -> float:
        cost = self.cost_per_token(stats)
        return max((self.time_to_finish(t, now, stats) / cost for t in group.trajectories if not t.finished),
                   default=0.0)

    @staticmethod
    def cost_per_token(stats: RunningStats) -> float:
        return stats.seconds_per_token + stats.tool_seconds / stats.tokens_per_turn

    def time_to_finish(self, trajectory: Trajectory, now: float, stats: RunningStats) -> float:
        """T_complete of one trajectory, in seconds from `now`."""
        remaining_tokens = self.remaining_tokens(trajectory, stats)
        remaining_turns = remaining_tokens / stats.tokens_per_turn
        resume_in = 0.0
        if trajectory.status is TrajectoryStatus.IN_TOOL and trajectory.tool_started_at is not None:
            resume_in = max(0.0, trajectory.tool_started_at + stats.tool_seconds - now)
        return (
            resume_in
            + remaining_tokens * stats.seconds_per_token
            + remaining_turns * stats.tool_seconds
        )

    def remaining_tokens(self, trajectory: Trajectory, stats: RunningStats) -> float:
        """The latest prediction less what was generated since; before any prediction, the
        running mean trajectory length less what was generated (at least one more turn)."""
        if trajectory.predicted_remaining is not None:
            since = trajectory.generated_tokens - trajectory.predicted_at_generated
            return max(0.0, trajectory.predicted_remaining - since)
        return max(stats.total_tokens - trajectory.generated_tokens, stats.tokens_per_turn)


class CriticalPathRule(LengthPredictionRule):
    """Beyond the paper: the same critical set, served longest-first inside.

    T_next, the time B groups are ready, is the finish time of the slowest critical group.
    When the critical trajectories outnumber the generation slots, granting slots in arrival
    order spreads them evenly, so the critical group with the most work left starts its last
    turns last and finishes at the end of the batch. Serving the critical group with the
    largest key first (longest processing time first, the makespan heuristic) starts that
    path early and fills the end of the batch with the shorter groups. LOW work is untouched.
    """

    name = "critical_path"
    longest_critical_first = True


class OracleRule(LengthPredictionRule):
    """The paper's rule with true remaining lengths (the simulator knows them)."""

    name = "oracle"

    def __init__(self, true_remaining: Callable[[Trajectory], float]) -> None:
        self._true_remaining = true_remaining

    def remaining_tokens(self, trajectory: Trajectory, stats: RunningStats) -> float:
        return max(0.0, float(self._true_remaining(trajectory)))


RULES: dict[str, type[PriorityRule]] = {
    rule.name: rule
    for rule in (FcfsRule, ActionLevelRule, LengthPredictionRule, CriticalPathRule, OracleRule)
}


def make_rule(name: str, *, true_remaining: Callable[[Trajectory], float] | None = None) -> PriorityRule:
    """The rule called `name`; `oracle` needs `true_remaining` (remaining tokens of a trajectory)."""
    if name not in RULES:
        raise ValueError(f"policy {name!r} is unknown (known: {', '.join(sorted(RULES))})")
    if name == "oracle":
        if true_remaining is None:
            raise ValueError("policy 'oracle' needs true_remaining (the simulator provides it)")
        return OracleRule(true_remaining)
    return RULES[name]()


def check_key(key: float, group_id: int) -> float:
    if not math.isfinite(key):
        raise ValueError(f"priority rule gave group {group_id} a non-finite key {key!r}")
    return key
