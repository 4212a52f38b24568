"""The `sdpa` attention backend: PyTorch's scaled_dot_product_attention over the paged pool,
for a packed batch of sequences (the CPU backend).

The runner packs every scheduled sequence's new tokens into one row ([1, N]); this context
writes their K/V to their slots, then lets each sequence's queries see its own context
(cached prefix + earlier chunks + the new tokens) up to their own position.

On CPU at decode batch sizes the cost is the number of ops, not FLOPs, so the work is
shaped into few calls:
- a prefill with no cached context attends over its own new K/V (no gather from the pool),
  and consecutive such prefills of one length share one call;
- decode rows share one call over their KV kept in rows between steps (`decode_rows.py`),
  with the query heads of one KV head laid out as that head's queries, so the call needs no
  grouped-query expansion.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from venusrl.engine.attention.decode_rows import DecodeRows
from venusrl.engine.attention.sequences import SequenceSlots
from venusrl.engine.kv_pool import KVPool
from venusrl.model.attention import sdpa


@dataclass(slots=True)
class _PrefillRun:
    start: int  # first new token of the run in the packed row
    count: int  # sequences in the run
    length: int  # new tokens of each
    context_slots: torch.Tensor | None  # a single sequence with a cached context; None: no context


class SdpaAttention:
    """An `AttentionContext` (see venusrl.model.attention) for one forward pass."""

    def __init__(self, pool: KVPool, rows: DecodeRows, sequences: list[SequenceSlots]):
        device = pool.k.device
        self.pool = pool
        self.rows = rows
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
                decode_contexts.append((seq.key, seq.context_slots))
            else:
                self._add_prefill(start, seq, device)
            start += seq.num_new
        self.decode_rows = torch.tensor(decode_rows, dtype=torch.long, device=device)
        self.is_pure_decode = not self.prefills
        # planned at every forward, so a request that did not decode in the previous one gives
        # its row up (its KV may have been recomputed since)
        self.decode = rows.plan(decode_contexts)

    def _add_prefill(self, start: int, seq: SequenceSlots, device: torch.device) -> None:
        fresh = len(seq.context_slots) == seq.num_new
        last = self.prefills[-1] if self.prefills else None
        if fresh and last and last.context_slots is None and last.length == seq.num_new \
                and last.start + last.count * last.length == start:
            last.count += 1
            return
        slots = None if fresh else torch.tensor(seq.context_slots, dtype=torch.long, device=device)
        self.prefills.append(_PrefillRun(start, 1, seq.num_new, slots))

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.write(layer_idx, self.new_slots, k[0], v[0])
        if self.is_pure_decode:  # the rows are the whole batch, in order
            return self._decode(layer_idx, q[0], k[0], v[0])[None]
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
            rows = self.decode_rows
            out[0, rows] = self._decode(layer_idx, q[0, rows], k[0, rows], v[0, rows])
        return out

    def _decode(self, layer_idx: int, queries: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor) -> torch.Tensor:
        """queries, new_k, new_v [R, heads, Dh], one per decode row in batch order."""
        plan = self.decode
        rows, num_heads, head_dim = queries.shape
        row_k, row_v = self.rows.layer(layer_idx)
        kv_heads = row_k.shape[2]
        row_k.view(-1, kv_heads, head_dim).index_copy_(0, plan.write_index, new_k)
        row_v.view(-1, kv_heads, head_dim).index_copy_(0, plan.write_index, new_v)
        keys = row_k[:rows, : plan.max_length].transpose(1, 2)  # [R, Hkv, L, Dh], read in place
        values = row_v[:rows, : plan.max_length].transpose(1, 2)
        if plan.row_to_batch is not None:
            queries = queries.index_select(0, plan.row_to_batch)
        # query head h reads KV head h // (Hq / Hkv): each KV head's queries become its rows
        grouped = queries.view(rows, kv_heads, num_heads // kv_heads, head_dim)
        out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=plan.mask).reshape(rows, num_heads, head_dim)
        return out if plan.batch_to_row is None else out.index_select(0, plan.batch_to_row)


class SdpaBackend:
    """The CPU attention backend: owns the decode rows, which live across steps."""

    def __init__(self, pool: KVPool):
        self.pool = pool
        self.rows = DecodeRows(pool)

    def context(self, sequences: list[SequenceSlots]) -> SdpaAttention:
        return SdpaAttention(self.pool, self.rows, sequences)

