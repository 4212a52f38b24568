"""Attention over the paged KV pool, one backend per kernel family (`engine.attention_backend`).

A backend is built once from the pool; its `context(sequences)` returns the model's
`AttentionContext` (venusrl.model.attention) for one packed forward pass: it stores the new
tokens' K/V into their pool slots and lets each sequence's queries see its own context.

- `sdpa` (sdpa.py): PyTorch's scaled_dot_product_attention, with decode KV kept in rows
  between steps (decode_rows.py); the CPU backend.
- `triton` (triton_backend.py, kernels in triton_kernels.py): kernels that read K/V straight
  from the pool through a device table of each sequence's slots (slot_table.py): no gather into
  rows, no shape-dependent plan, and a decode step that a CUDA graph can replay; the GPU backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from venusrl.engine.attention.sequences import SequenceSlots
from venusrl.engine.kv_pool import KVPool
from venusrl.model.attention import AttentionContext

__all__ = ["ATTENTION_BACKENDS", "AttentionBackend", "SequenceSlots", "make_backend", "resolve_backend"]


class AttentionBackend(Protocol):
    def context(self, sequences: list[SequenceSlots]) -> AttentionContext:
        """Called for every forward, an empty one included: state kept across steps (decode
        rows, slot-table rows) lives only while its request runs in consecutive forwards."""
        ...


def _sdpa(pool: KVPool, max_sequences: int) -> AttentionBackend:
    from venusrl.engine.attention.sdpa import SdpaBackend

    return SdpaBackend(pool)


def _triton(pool: KVPool, max_sequences: int) -> AttentionBackend:
    from venusrl.engine.attention.triton_backend import TritonBackend

    return TritonBackend(pool, max_sequences)


# Backends by name (`engine.attention_backend`), imported when chosen: triton is optional on CPU.
ATTENTION_BACKENDS: dict[str, Callable[[KVPool, int], AttentionBackend]] = {"sdpa": _sdpa, "triton": _triton}


def resolve_backend(name: str, device: torch.device | str) -> str:
    """`auto` is triton on a CUDA device and sdpa elsewhere; a named backend stays itself."""
    if name == "auto":
        return "triton" if torch.device(device).type == "cuda" else "sdpa"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"engine.attention_backend: {name!r} is not one of auto, {', '.join(ATTENTION_BACKENDS)}")
    return name


def make_backend(name: str, pool: KVPool, max_sequences: int) -> AttentionBackend:
    """The backend `name` (resolved) over `pool`, for forwards of at most `max_sequences` sequences."""
    return ATTENTION_BACKENDS[resolve_backend(name, pool.k.device)](pool, max_sequences)
