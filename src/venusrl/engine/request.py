"""State of one generation request inside the scheduler (pure)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

from venusrl.engine.radix_cache import RadixNode
from venusrl.types import Priority, SamplingParams

# A caller's trajectory id is kept while the trajectory lives: bounded, so ids cannot fill
# memory (a 1 MB id per request did, before), and long enough for any UUID-based scheme.
MAX_TRAJECTORY_ID_CHARS = 256


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(slots=True, eq=False)
class Request:
    """One turn of generation. Its token sequence is ``prompt_ids + output_ids``.

    KV layout: ``kv_slots[i]`` holds the KV of token ``i``. The first ``cached_len`` slots
    belong to the radix tree (locked through ``prefix_node``); the rest are private pages,
    starting at a page boundary. ``num_computed`` tokens have their KV written; slots past
    it are allocated for the batch in flight.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    trajectory_key: Hashable  # the caller's trajectory id, or an implicit per-request key
    trajectory_id: str | None
    priority: Priority  # effective priority (declared, or LOW while demoted)
    arrival: int  # admission order tie-break (FIFO inside a priority)
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    kv_slots: list[int] = field(default_factory=list)
    num_computed: int = 0
    cached_len: int = 0
    prefix_node: RadixNode | None = None
    finish_reason: str | None = None
    prior_computed: int = 0  # most tokens of this sequence ever computed, to count recompute
    num_retractions: int = 0

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_range(self, start: int, end: int) -> list[int]:
        """``all_ids[start:end]`` without building the whole sequence."""
        n = len(self.prompt_ids)
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:end] + self.output_ids[: max(0, end - n)]

    @property
    def pending_tokens(self) -> int:
        """Tokens still to compute before the next sample."""
        return self.seq_len - self.num_computed


@dataclass(slots=True, frozen=True)
class PartialOutput:
    """What an aborted or finished request produced, so the caller can resume or return it."""

    request_id: str
    trajectory_id: str | None
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
