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
            self.decode_slots = torch.tensor(padded, dtype=torch.long, device=device)  # [D, L]
            lengths = torch.tensor([len(c) for c in decode_contexts], device=device)
            self.decode_mask = (torch.arange(longest, device=device)[None] < lengths[:, None])[:, None, None, :]

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.write(layer_idx, self.new_slots, k[0], v[0])
        out = torch.empty_like(q)
        pool_k, pool_v = self.pool.k[layer_idx], self.pool.v[layer_idx]
        for start, new, slots in self.prefills:
            context = len(slots)
            mask = None
            if context > new:  # a cached prefix: query i sees keys up to context - new + i
                mask = torch.ones(new, context, dtype=torch.bool, device=q.device).tril(diagonal=context - new)
            out[:, start : start + new] = sdpa(
                q[:, start : start + new], pool_k[slots][None], pool_v[slots][None], mask=mask, causal=mask is None
            )
        if len(self.decode_rows):
            queries = q[0, self.decode_rows][:, None]  # [D, 1, Hq, Dh]
            keys, values = pool_k[self.decode_slots], pool_v[self.decode_slots]  # [D, L, Hkv, Dh]
            out[0, self.decode_rows] = sdpa(queries, keys, values, mask=self.decode_mask, causal=False)[:, 0]
        return out


# Attention backends by name (`engine.attention_backend`). A GPU backend (flash-attn,
# flashinfer) is a class with this constructor and `attend`, registered here.
ATTENTION_BACKENDS: dict[str, type[PagedAttention]] = {"sdpa": PagedAttention}
