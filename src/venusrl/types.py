"""Types shared by every component."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any


class Priority(IntEnum):
    """Scheduling priority of a trajectory; lower is more urgent (DESIGN.md §4)."""

    PROMOTED = 0  # at its last admissible weight version: must finish now
    HIGH = 1  # in a critical group: the trainer is waiting for it
    LOW = 2  # everything else: runs when slots would otherwise idle


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to sample one turn. temperature 0 means greedy."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


class TrajectoryStatus(str, Enum):
    """Where a trajectory is in its agent loop."""

    WAITING = "waiting"  # handed out, waiting for a generation slot (first turn or after a tool)
    GENERATING = "generating"  # a turn is being generated
    IN_TOOL = "in_tool"  # a tool call is running; holds no generation slot
    DONE = "done"  # finished with a reward
    DISCARDED = "discarded"  # stale or failed; its group gets a fresh attempt instead


class GroupStatus(str, Enum):
    RUNNING = "running"  # some trajectory unfinished
    READY = "ready"  # all K done, handed to the trainer, not yet in a weight step
    TRAINED = "trained"  # consumed by a weight step
    DROPPED = "dropped"  # given up (a trajectory kept failing); reported, never trained


@dataclass(slots=True, frozen=True)
class Prompt:
    """One dataset row: chat messages plus whatever the environment needs (answer, repo, ...)."""

    id: str
    messages: tuple[dict[str, Any], ...]
    metadata: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The row an environment's `reset` reads: the metadata plus the messages."""
        return {**self.metadata, "messages": [dict(m) for m in self.messages]}


@dataclass(slots=True)
class Turn:
    """One generated turn: the weight version that produced it and what followed."""

    weight_version: int
    context_tokens: int  # non-generated tokens (prompt, observation) fed before this turn
    generated_tokens: int
    started_at: float
    ended_at: float
    tool_seconds: float | None = None  # None: no tool call followed, or it has not returned
    tool_error: bool = False


@dataclass(slots=True, eq=False)
class Trajectory:
    """One attempt at one of the K rollouts of a group.

    token_ids, generated_mask and logprobs are aligned: the mask is True for tokens the policy
    generated, whose behaviour log-prob is in logprobs; context tokens carry mask False, logprob 0.
    """

    id: int
    group_id: int
    index: int  # position in the group, 0..K-1; a re-run keeps the index
    attempt: int  # 0 for the first run, +1 for each re-run
    prompt: Prompt
    start_version: int  # weight version when handed out; staleness is measured from it
    status: TrajectoryStatus = TrajectoryStatus.WAITING
    token_ids: list[int] = field(default_factory=list)
    generated_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    generated_tokens: int = 0
    tool_errors: int = 0
    reward: float | None = None
    # Scheduling state owned by the coordinator.
    pending_context_tokens: int = 0  # context tokens fed since the last turn ended
    turn_started_at: float | None = None
    tool_started_at: float | None = None
    predicted_remaining: float | None = None  # latest prediction of remaining generated tokens
    predicted_at_generated: int = 0  # generated_tokens when that prediction was made

    @property
    def finished(self) -> bool:
        return self.status in (TrajectoryStatus.DONE, TrajectoryStatus.DISCARDED)


@dataclass(slots=True, eq=False)
class Group:
    """A prompt replicated K times; trainable only when all K current attempts are done."""

    id: int
    seq: int  # admission order
    prompt: Prompt
    trajectories: list[Trajectory]
    admitted_at: float
    status: GroupStatus = GroupStatus.RUNNING
    ready_at: float | None = None

    @property
    def all_done(self) -> bool:
        return all(t.status is TrajectoryStatus.DONE for t in self.trajectories)
