"""The attention interface between the model and whoever owns the KV.

The model projects q/k/v and applies RoPE; an `AttentionContext` decides where K/V live and
which keys each query sees. With no context the model runs plain causal attention over the
batch it was given. A context carries its own state (a dense cache here; the engine's paged
pool later), so the model stays free of any KV bookkeeping.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class AttentionContext(Protocol):
    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [B, T, Hq, D]; k, v: [B, T, Hkv, D] for the new tokens. Returns [B, T, Hq, D]."""
        ...


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads; q [B,Tq,Hq,D], k/v [B,Tk,Hkv,D]."""
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    grouped = q.shape[1] != k.shape[1]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, enable_gqa=grouped)
    return out.transpose(1, 2)


class CausalAttention:
    """No KV kept: every query sees the keys at or before its own position in the same batch."""

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return sdpa(q, k, v, mask=None, causal=True)
