"""Attention over the paged KV pool for a packed batch of sequences.

The runner packs every scheduled sequence's new tokens into one row ([1, N]); this context
writes their K/V to their slots, then lets each sequence's queries see its own context
(cached prefix + earlier chunks + the new tokens) up to their own position.

On CPU at decode batch sizes the cost is the number of ops, not FLOPs, so the work is
shaped into few calls:
- a prefill with no cached context attends over its own new K/V (no gather from the pool),
  and consecutive such prefills of one length share one call;
- decode rows share one call over their contexts gathered a page at a time (a request's KV
  fills whole pages in order, see `kv_slots.py`), with the query heads of one KV head laid
  out as that head's queries, so the call needs no grouped-query expansion.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from venusrl.engine.kv_pool import KVPool
from venusrl.model.attention import sdpa


@dataclass(slots=True)
class SequenceSlots:
    num_new: int  # new tokens of this sequence in the packed row, in order
    context_slots: list[int]  # slots of every token it attends to; the new ones last


@dataclass(slots=True)
class _PrefillRun:
    start: int  # first new token of the run in the packed row
    count: int  # sequences in the run
    length: int  # new tokens of each
    context_slots: torch.Tensor | None  # a single sequence with a cached context; None: no context


class PagedAttention:
    """An `AttentionContext` (see venusrl.model.attention) for one forward pass."""

    def __init__(self, pool: KVPool, sequences: list[SequenceSlots]):
        device = pool.k.device
        self.pool = pool
        self.new_slots = torch.tensor(
            [s for seq in sequences for s in seq.context_slots[len(seq.context_slots) - seq.num_new :]],
            dtype=torch.long, device=device,
        )
        self.prefills: list[_PrefillRun] = []
        decode_rows, decode_contexts = [], []
        start = 0
        for seq in sequences:
            if seq.num_new == 1 and len(seq.context_slots) > 1:
                decode_rows.append(start)
                decode_contexts.append(seq.context_slots)
            else:
                self._add_prefill(start, seq, device)
            start += seq.num_new
        self.decode_rows = torch.tensor(decode_rows, dtype=torch.long, device=device)
        self.is_pure_decode = not self.prefills
        if decode_contexts:
            self._plan_decode(decode_contexts, device)

    def _add_prefill(self, start: int, seq: SequenceSlots, device: torch.device) -> None:
        fresh = len(seq.context_slots) == seq.num_new
        last = self.prefills[-1] if self.prefills else None
        if fresh and last and last.context_slots is None and last.length == seq.num_new \
                and last.start + last.count * last.length == start:
            last.count += 1
            return
        slots = None if fresh else torch.tensor(seq.context_slots, dtype=torch.long, device=device)
        self.prefills.append(_PrefillRun(start, 1, seq.num_new, slots))

    def _plan_decode(self, contexts: list[list[int]], device: torch.device) -> None:
        page = self.pool.page_size
        pages = [c[::page] for c in contexts]
        longest = max(len(p) for p in pages)
        # slot // page_size of each page's first slot is its page id; padding reads page 0
        padded = [[s // page for s in p] + [0] * (longest - len(p)) for p in pages]
        self.decode_pages = torch.tensor(padded, dtype=torch.long, device=device).view(-1)
        self.decode_shape = (len(contexts), longest * page)
        self.decode_mask = None  # contexts that fill their pages exactly need no padding mask
        if any(len(c) != longest * page for c in contexts):
            lengths = torch.tensor([len(c) for c in contexts], device=device)
            padding = torch.arange(longest * page, device=device)[None] >= lengths[:, None]
            # additive, built once per step (SDPA would convert a boolean mask in every layer)
            mask = torch.zeros(padding.shape, dtype=self.pool.k.dtype, device=device).masked_fill_(padding, -torch.inf)
            self.decode_mask = mask[:, None, None, :]

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.write(layer_idx, self.new_slots, k[0], v[0])
        if self.is_pure_decode:  # the rows are the whole batch, in order
            return self._decode(layer_idx, q[0])[None]
        out = torch.empty_like(q)
        for run in self.prefills:
            end = run.start + run.count * run.length
            queries = q[0, run.start : end].view(run.count, run.length, *q.shape[2:])
            if run.context_slots is None:
                keys = k[0, run.start : end].view(run.count, run.length, *k.shape[2:])
                values = v[0, run.start : end].view(run.count, run.length, *v.shape[2:])
                out[0, run.start : end] = sdpa(queries, keys, values, mask=None, causal=True).flatten(0, 1)
                continue
            context = len(run.context_slots)
            # query i of the new tokens sees keys up to context - length + i
            mask = torch.ones(run.length, context, dtype=torch.bool, device=q.device).tril(diagonal=context - run.length)
            keys = self.pool.k[layer_idx].index_select(0, run.context_slots)[None]
            values = self.pool.v[layer_idx].index_select(0, run.context_slots)[None]
            out[:, run.start : end] = sdpa(queries, keys, values, mask=mask, causal=False)
        if len(self.decode_rows):
            out[0, self.decode_rows] = self._decode(layer_idx, q[0, self.decode_rows])
        return out

    def _decode(self, layer_idx: int, queries: torch.Tensor) -> torch.Tensor:
        """queries [R, Hq, Dh], one per decode row, against their padded contexts."""
        rows, num_heads, head_dim = queries.shape
        kv_heads = self.pool.k.shape[2]
        shape = (*self.decode_shape, kv_heads, head_dim)  # [R, L, Hkv, Dh]
        keys = self.pool.paged_k(layer_idx).index_select(0, self.decode_pages).view(shape).transpose(1, 2)
        values = self.pool.paged_v(layer_idx).index_select(0, self.decode_pages).view(shape).transpose(1, 2)
        # query head h reads KV head h // (Hq / Hkv): each KV head's queries become its rows
        grouped = queries.view(rows, kv_heads, num_heads // kv_heads, head_dim)
        out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=self.decode_mask)
        return out.reshape(rows, num_heads, head_dim)


# Attention backends by name (`engine.attention_backend`). A GPU backend (flash-attn,
# flashinfer) is a class with this constructor and `attend`, registered here.
ATTENTION_BACKENDS: dict[str, type[PagedAttention]] = {"sdpa": PagedAttention}
