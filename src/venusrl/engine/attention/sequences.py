"""What the runner tells an attention backend about each sequence of a packed forward."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SequenceSlots:
    key: str  # the request: state a backend keeps across steps (rows) is kept under it
    num_new: int  # new tokens of this sequence in the packed row, in order
    context_slots: list[int]  # slots of every token it attends to; the new ones last
