"""Types shared by every component."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


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
