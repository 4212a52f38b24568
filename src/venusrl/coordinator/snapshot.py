"""The coordinator's state at a weight-step boundary, for checkpoint and resume.

Taken right after a weight step, a snapshot splits every prompt handed out so far into:
trained (in the checkpointed weights; only counted), ready (all K done, waiting for the next
step; kept whole), running (kept with their DONE trajectories; unfinished ones re-run on
resume, because their sandboxes and engine requests died with the process) and dropped.
Resuming from it with the dataset advanced by `prompts_consumed` trains every prompt
exactly once.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

from venusrl.types import Group, GroupStatus


@dataclass(slots=True)
class CoordinatorSnapshot:
    weight_version: int
    prompts_consumed: int  # prompts taken from the dataset stream since the run began
    ready: list[Group]
    running: list[Group]
    counts: dict[str, int]
    next_group_id: int
    next_trajectory_id: int

    def to_bytes(self) -> bytes:
        return pickle.dumps(self)

    @staticmethod
    def from_bytes(data: bytes) -> CoordinatorSnapshot:
        snapshot = pickle.loads(data)
        if not isinstance(snapshot, CoordinatorSnapshot):
            raise ValueError(f"not a coordinator snapshot: {type(snapshot).__name__}")
        return snapshot

    def check(self) -> None:
        """Ready groups are complete; running ones are not; no group appears twice."""
        ids = [g.id for g in self.ready] + [g.id for g in self.running]
        if len(ids) != len(set(ids)):
            raise ValueError("snapshot lists a group twice")
        for group in self.ready:
            if group.status is not GroupStatus.READY or not group.all_done:
                raise ValueError(f"snapshot: ready group {group.id} is not complete")
        for group in self.running:
            if group.status is not GroupStatus.RUNNING:
                raise ValueError(f"snapshot: running group {group.id} is {group.status.value}")


def copy_groups(groups: list[Group]) -> list[Group]:
    """Deep copies, so the live coordinator can move on while the snapshot is written."""
    return copy.deepcopy(groups)

