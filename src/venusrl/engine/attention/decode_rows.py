"""Decode KV kept in rows between steps, for attention on CPU.

Gathering every decoding sequence's KV out of the pool's slots at every step copies each
context once per layer per step; on CPU that costs about as much as the attention itself. A
request that decodes in consecutive steps keeps its KV in a row here instead: each step
writes one token per row (next to the pool write) and attention reads the rows in place.

Invariants:
- rows 0..R-1 hold exactly this step's R decoding requests (compact), row r holding the KV
  of its request's first `lengths[r]` tokens, equal to what the pool holds for them;
- a request keeps its row only while it decodes in consecutive steps with its context one
  token longer each time. A request that misses a step (retracted, preempted, prefilling a
  chunk, its KV dropped by a weight update) is filled again from the pool when it next
  decodes, so a row never outlives the KV it mirrors.

Memory: rows x the longest decoding context, in every layer: up to the decoding requests'
KV once more (and more when their lengths differ a lot). On CPU, where this backend runs, that
buys a step without the gather; a GPU backend reads the pool's pages in place instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from venusrl.engine.kv_pool import KVPool

_GROWTH = 64  # row capacity grows in multiples of this many tokens


@dataclass(slots=True)
class DecodePlan:
    """This step's decoding requests (in batch order) mapped onto rows."""

    num_rows: int
    max_length: int  # longest context, the new token included
    write_index: torch.Tensor  # flat row-token index of each request's new token
    batch_to_row: torch.Tensor | None  # row of each request; None when request i is row i
    row_to_batch: torch.Tensor | None
    mask: torch.Tensor | None  # additive [R, 1, 1, max_length]; None when every context fills it


class DecodeRows:
    def __init__(self, pool: KVPool):
        self.pool = pool
        layers, _, heads, dim = pool.k.shape
        self.k = pool.k.new_zeros(layers, 0, 0, heads, dim)  # [layers, rows, capacity, heads, dim]
        self.v = pool.v.new_zeros(layers, 0, 0, heads, dim)
        self.row_of: dict[str, int] = {}
        self.lengths: list[int] = []  # tokens held by each row

    def plan(self, requests: list[tuple[str, list[int]]]) -> DecodePlan | None:
        """Rows for this forward's decoding requests: (key, context slots with the new token
        last). Called for every forward, with no requests when none decodes."""
        count = len(requests)
        if not count:
            self.row_of, self.lengths = {}, []
            return None
        kept = {key: self.row_of[key] for key, slots in requests
                if key in self.row_of and self.lengths[self.row_of[key]] == len(slots) - 1}
        self._reserve(count, max(len(slots) for _, slots in requests))
        # keep rows compact: kept rows beyond the first `count` move into free ones below it
        taken = set(kept.values())
        holes = [row for row in range(count) if row not in taken]
        movers = sorted(row for row in taken if row >= count)
        if movers:
            destination = holes[: len(movers)]
            self._move(movers, destination)
            moved = dict(zip(movers, destination, strict=True))
            kept = {key: moved.get(row, row) for key, row in kept.items()}
            holes = holes[len(movers):]
        rows = []
        for key, slots in requests:
            row = kept.get(key)
            if row is None:
                row = holes.pop(0)
                self._fill(row, slots[:-1])
            rows.append(row)
        self.row_of = {key: row for (key, _), row in zip(requests, rows, strict=True)}
        self.lengths = [0] * count
        for (_, slots), row in zip(requests, rows, strict=True):
            self.lengths[row] = len(slots)
        return self._plan(rows)

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s rows, [rows, capacity, heads, dim] each."""
        return self.k[layer], self.v[layer]

    def _plan(self, rows: list[int]) -> DecodePlan:
        device = self.k.device
        capacity = self.k.shape[2]
        longest = max(self.lengths)
        identity = rows == list(range(len(rows)))
        batch_to_row = None if identity else torch.tensor(rows, dtype=torch.long, device=device)
        row_to_batch = None
        if not identity:
            inverse = [0] * len(rows)
            for index, row in enumerate(rows):
                inverse[row] = index
            row_to_batch = torch.tensor(inverse, dtype=torch.long, device=device)
        write_index = torch.tensor([row * capacity + self.lengths[row] - 1 for row in rows], dtype=torch.long,
                                   device=device)
        mask = None
        if any(length != longest for length in self.lengths):
            lengths = torch.tensor(self.lengths, device=device)
            padding = torch.arange(longest, device=device)[None] >= lengths[:, None]
            # additive, built once per step (SDPA would convert a boolean mask in every layer)
            mask = torch.zeros(padding.shape, dtype=self.k.dtype, device=device).masked_fill_(padding, -torch.inf)
            mask = mask[:, None, None, :]
        return DecodePlan(len(rows), longest, write_index, batch_to_row, row_to_batch, mask)

    def _reserve(self, rows: int, tokens: int) -> None:
        """Room for `rows` rows of `tokens` tokens. The capacity doubles when a context outgrows
        it and shrinks back once the longest is under a quarter of it, so one long request
        does not leave every row that long after it is gone."""
        layers, have_rows, capacity, heads, dim = self.k.shape
        shrink = capacity > _GROWTH and tokens <= capacity // 4
        if rows <= have_rows and tokens <= capacity and not shrink:
            return
        target = capacity  # a multiple of _GROWTH already
        if tokens > capacity:
            target = max(tokens, 2 * capacity)
        elif shrink:  # every kept row holds fewer than `tokens` tokens: nothing kept is cut
            target = 2 * tokens
        new_capacity = -(-target // _GROWTH) * _GROWTH
        kept = min(capacity, new_capacity)
        for name in ("k", "v"):
            old = getattr(self, name)
            resized = old.new_zeros(layers, max(rows, have_rows), new_capacity, heads, dim)
            resized[:, :have_rows, :kept] = old[:, :, :kept]
            setattr(self, name, resized)

    def _move(self, sources: list[int], destinations: list[int]) -> None:
        src = torch.tensor(sources, dtype=torch.long, device=self.k.device)
        dst = torch.tensor(destinations, dtype=torch.long, device=self.k.device)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    def _fill(self, row: int, slots: list[int]) -> None:
        index = torch.tensor(slots, dtype=torch.long, device=self.k.device)
        self.k[:, row, : len(slots)] = self.pool.k[:, index]
        self.v[:, row, : len(slots)] = self.pool.v[:, index]
