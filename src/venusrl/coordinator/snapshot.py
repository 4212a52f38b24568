"""The coordinator's state at a weight-step boundary, for checkpoint and resume.

Taken right after a weight step, a snapshot splits every prompt handed out so far into:
trained (in the checkpointed weights; only counted), ready (all K done, waiting for the next
step; kept whole), running (kept with their DONE trajectories; unfinished ones re-run on
resume, because their sandboxes and engine requests died with the process) and dropped.
Resuming from it with the dataset advanced by `prompts_consumed` trains every prompt
exactly once.

On disk it is JSON (`to_bytes`/`from_bytes`), not a pickle: reading a run directory from
elsewhere must not run its code, and a torn or edited file is refused with the field that
is wrong.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from venusrl.types import Group, GroupStatus, Prompt, Trajectory, TrajectoryStatus, Turn

FORMAT = "venusrl.coordinator_snapshot"
VERSION = 1


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
        data = {"format": FORMAT, "version": VERSION, "weight_version": self.weight_version,
                "prompts_consumed": self.prompts_consumed, "ready": [_group_data(g) for g in self.ready],
                "running": [_group_data(g) for g in self.running], "counts": self.counts,
                "next_group_id": self.next_group_id, "next_trajectory_id": self.next_trajectory_id}
        try:
            return json.dumps(data, separators=(",", ":")).encode()
        except TypeError as err:  # a prompt's metadata that JSON cannot hold
            raise ValueError(f"coordinator snapshot: {err}") from None

    @staticmethod
    def from_bytes(data: bytes) -> CoordinatorSnapshot:
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"not a coordinator snapshot: {err}") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"not a coordinator snapshot (expected format {FORMAT!r})")
        if raw.get("version") != VERSION:
            raise ValueError(f"coordinator snapshot version {raw.get('version')!r}, this venusrl reads {VERSION}")
        try:
            return CoordinatorSnapshot(
                weight_version=int(raw["weight_version"]), prompts_consumed=int(raw["prompts_consumed"]),
                ready=[_group(g) for g in raw["ready"]], running=[_group(g) for g in raw["running"]],
                counts={str(k): int(v) for k, v in raw["counts"].items()},
                next_group_id=int(raw["next_group_id"]), next_trajectory_id=int(raw["next_trajectory_id"]))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"coordinator snapshot: malformed field ({type(err).__name__}: {err})") from None

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


# ---- JSON form: every field of Group, Trajectory, Turn and Prompt, enums by value -------------

def _group_data(group: Group) -> dict[str, Any]:
    data = {f.name: getattr(group, f.name) for f in fields(group)}
    data.update(prompt=_prompt_data(group.prompt), status=group.status.value,
                trajectories=[_trajectory_data(t) for t in group.trajectories])
    return data


def _group(data: dict[str, Any]) -> Group:
    prompt = _prompt(data.pop("prompt"))
    trajectories = [_trajectory(t, prompt) for t in data.pop("trajectories")]
    return Group(prompt=prompt, trajectories=trajectories, status=GroupStatus(data.pop("status")), **data)


def _trajectory_data(trajectory: Trajectory) -> dict[str, Any]:
    data = {f.name: getattr(trajectory, f.name) for f in fields(trajectory) if f.name != "prompt"}
    data.update(status=trajectory.status.value, turns=[asdict(turn) for turn in trajectory.turns])
    return data


def _trajectory(data: dict[str, Any], prompt: Prompt) -> Trajectory:
    """A trajectory's prompt is its group's (one object, as the coordinator made it)."""
    turns = [Turn(**turn) for turn in data.pop("turns")]
    return Trajectory(prompt=prompt, status=TrajectoryStatus(data.pop("status")), turns=turns, **data)


def _prompt_data(prompt: Prompt) -> dict[str, Any]:
    return {"id": prompt.id, "messages": list(prompt.messages), "metadata": prompt.metadata}


def _prompt(data: dict[str, Any]) -> Prompt:
    return Prompt(id=str(data["id"]), messages=tuple(data["messages"]), metadata=dict(data["metadata"]))
