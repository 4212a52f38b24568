"""Attention over the paged KV pool for a packed batch of sequences.

The runner packs every scheduled sequence's new tokens into one row ([1, N]); this context
writes their K/V to their slots, then lets each sequence's queries see its own context
slots (cached prefix + earlier chunks + the new tokens) up to their own position. Decode
rows (one new token each) share one padded SDPA call; prefill chunks run one call each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from venusrl.engine.kv_pool import KVPool
from venusrl.model.attention import sdpa


@dataclass(slots=True)
class SequenceSlots:
    num_new: int  # new tokens of this sequence in the packed row, in order
    context_slots: list[int]  # slots of every token it attends to; the new ones last


class PagedAttention:
    """An `AttentionContext` (see venusrl.model.attention) for one forward pass."""

    def __init__(self, pool: KVPool, sequences: list[SequenceSlots]):
        device = pool.k.device
        self.pool = pool
        self.new_slots = torch.tensor(
            [s for seq in sequences for s in seq.context_slots[len(seq.context_slots) - seq.num_new :]],
            dtype=torch.long, device=device,
        )
        self.prefills: list[tuple[int, int, torch.Tensor]] = []  # (start in row, new tokens, context slots)
        decode_rows, decode_contexts = [], []
        start = 0
        for seq in sequences:
            if seq.num_new == 1:
                decode_rows.append(start)
                decode_contexts.append(seq.context_slots)
            else:
                self.prefills.append((start, seq.num_new, torch.tensor(seq.context_slots, dtype=torch.long, device=device)))
            start += seq.num_new
        self.decode_rows = torch.tensor(decode_rows, dtype=torch.long, device=device)
        if decode_contexts:
            longest = max(len(c) for c in decode_contexts)
            padded = [c + [0] * (longest - len(c)) for c in decode_contexts]
            # flat for index_select (several times faster than 2-D advanced indexing on CPU)
            self.decode_slots = torch.tensor(padded, dtype=torch.long, device=device).view(-1)
            self.decode_shape = (len(padded), longest)
            self.decode_mask = None  # contexts of one length need no padding mask
            if any(len(c) != longest for c in decode_contexts):
                lengths = torch.tensor([len(c) for c in decode_contexts], device=device)
                self.decode_mask = (torch.arange(longest, device=device)[None] < lengths[:, None])[:, None, None, :]

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.write(layer_idx, self.new_slots, k[0], v[0])
        pool_k, pool_v = self.pool.k[layer_idx], self.pool.v[layer_idx]
        if not self.prefills:  # a pure decode step: the rows are the whole batch, in order
            return self._decode(q[0][:, None], pool_k, pool_v).transpose(0, 1)
        out = torch.empty_like(q)
        for start, new, slots in self.prefills:
            context = len(slots)
            mask = None
            if context > new:  # a cached prefix: query i sees keys up to context - new + i
                mask = torch.ones(new, context, dtype=torch.bool, device=q.device).tril(diagonal=context - new)
            keys, values = pool_k.index_select(0, slots)[None], pool_v.index_select(0, slots)[None]
            out[:, start : start + new] = sdpa(q[:, start : start + new], keys, values, mask=mask, causal=mask is None)
        if len(self.decode_rows):
            out[0, self.decode_rows] = self._decode(q[0, self.decode_rows][:, None], pool_k, pool_v)[:, 0]
        return out

    def _decode(self, queries: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor) -> torch.Tensor:
        """queries [D, 1, Hq, Dh], one per decode row, against their padded contexts."""
        shape = (*self.decode_shape, *pool_k.shape[1:])  # [D, L, Hkv, Dh]
        keys = pool_k.index_select(0, self.decode_slots).view(shape)
        values = pool_v.index_select(0, self.decode_slots).view(shape)
        return sdpa(queries, keys, values, mask=self.decode_mask, causal=False)


# Attention backends by name (`engine.attention_backend`). A GPU backend (flash-attn,
# flashinfer) is a class with this constructor and `attend`, registered here.
ATTENTION_BACKENDS: dict[str, type[PagedAttention]] = {"sdpa": PagedAttention}
