"""Which batch sizes get a CUDA graph, which graph a decode step replays, and how its inputs
are padded to that size (pure: lists of ints; engine/cuda_graphs.py owns the graphs).

A graph replays fixed shapes, so a decode step of B sequences runs the graph of the smallest
captured size >= B with the rest padded: a padding row stores no K/V (slot -1), writes its
table entry into the scratch row, and attends over nothing (length 0).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

SMALL_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 16


def graph_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16 below `max_batch`, then `max_batch` itself: every
    batch of 1..max_batch has a bucket, and padding wastes under 16 rows past 8."""
    if max_batch < 1:
        raise ValueError(f"engine.max_running_requests must be >= 1, got {max_batch}")
    small = [b for b in SMALL_BUCKETS if b < max_batch]
    return small + list(range(BUCKET_STEP, max_batch, BUCKET_STEP)) + [max_batch]


def bucket_for(batch: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding `batch` rows; None for an empty batch or one past the largest."""
    if batch < 1 or batch > buckets[-1]:
        return None
    return buckets[bisect_left(buckets, batch)]


@dataclass(slots=True, frozen=True)
class DecodeStep:
    """A decode-only step's inputs, one entry per sequence in batch order."""

    token_ids: list[int]
    positions: list[int]
    new_slots: list[int]  # pool slot of each new token's K/V
    new_index: list[int]  # flat slot-table index of each new token
    rows: list[int]  # slot-table row of each sequence
    lengths: list[int]  # context length, the new token included

    def padded(self, size: int, pad_index: int, pad_row: int) -> list[list[int]]:
        """The six input rows padded to `size` (the graph's static input order)."""
        pad = size - len(self.token_ids)
        if pad < 0:
            raise ValueError(f"a decode step of {len(self.token_ids)} sequences does not fit a bucket of {size}")
        return [self.token_ids + [0] * pad, self.positions + [0] * pad, self.new_slots + [-1] * pad,
                self.new_index + [pad_index] * pad, self.rows + [pad_row] * pad, self.lengths + [0] * pad]
