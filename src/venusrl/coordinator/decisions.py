"""What the coordinator hands back from each event."""

from __future__ import annotations

from dataclasses import dataclass, field

from venusrl.types import Group, Priority, Prompt, Trajectory


@dataclass(slots=True, frozen=True)
class PriorityPolicy:
    """The published priority policy; `version` increases by one with each change."""

    version: int
    high_groups: frozenset[int]
    promoted: frozenset[int]  # trajectory ids at their last admissible weight version

    def priority(self, group_id: int, trajectory_id: int) -> Priority:
        if trajectory_id in self.promoted:
            return Priority.PROMOTED
        if group_id in self.high_groups:
            return Priority.HIGH
        return Priority.LOW


@dataclass(slots=True)
class Decisions:
    """Outputs of one event, for the rollout workers and the trainer to act on."""

    start: list[Trajectory] = field(default_factory=list)  # new trajectories and re-runs
    discarded: list[int] = field(default_factory=list)  # trajectory ids to abort, never train
    ready: list[Group] = field(default_factory=list)  # all K done: to the trainer
    dropped: list[Prompt] = field(default_factory=list)  # prompts given up, never trained
    policy: PriorityPolicy | None = None  # set when the policy changed

    def __bool__(self) -> bool:
        return bool(self.start or self.discarded or self.ready or self.dropped or self.policy)
