"""The `triton` attention backend: the kernels of triton_kernels.py over the pool, addressed
through the slot table (slot_table.py). The GPU backend; on CPU it runs under Triton's
interpreter (TRITON_INTERPRET=1), which the tests use to check it against `sdpa`.

Per forward the host builds the table's writes and a few index lists, uploads them in one
copy, and launches per layer one store and one or two attention kernels (decode rows: one
query each; the rest: extend). A decode-only step can instead be replayed from a CUDA graph
(engine/cuda_graphs.py) through `decode_step` and `decode_context`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from venusrl.engine.attention.sequences import SequenceSlots
from venusrl.engine.attention.slot_table import SlotTable
from venusrl.engine.attention.triton_kernels import (
    decode_attention,
    decode_scratch,
    extend_attention,
    store_kv,
)
from venusrl.engine.graph_buckets import DecodeStep
from venusrl.engine.kv_pool import KVPool


@dataclass(slots=True)
class _Decode:
    """Sequences with one new token: q_rows [B] (their row in the packed batch), rows [B]
    (their table row), lengths [B] (context length, the new token included)."""

    q_rows: torch.Tensor
    rows: torch.Tensor
    lengths: torch.Tensor
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None  # the splits' partial results, made at layer 0


@dataclass(slots=True)
class _Extend:
    """Sequences with several new tokens (a prefill or one of its chunks)."""

    rows: torch.Tensor
    prefix_lens: torch.Tensor  # tokens before the new ones
    new_lens: torch.Tensor
    q_starts: torch.Tensor  # first new token in the packed batch
    max_new: int


class TritonAttention:
    """An `AttentionContext` for one forward; the table already holds every context slot."""

    def __init__(self, backend: TritonBackend, new_slots: torch.Tensor, decode: _Decode | None,
                 extend: _Extend | None):
        self.backend = backend
        self.new_slots = new_slots
        self.decode = decode
        self.extend = extend

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pool, table, scale = self.backend.pool, self.backend.table.table, self.backend.scale
        k_pool, v_pool = pool.k[layer_idx], pool.v[layer_idx]
        store_kv(k_pool, v_pool, k[0], v[0], self.new_slots)
        queries = q[0]
        out = torch.empty(queries.shape, dtype=queries.dtype, device=queries.device)
        if self.decode is not None:
            d = self.decode
            if d.scratch is None:  # shared by the layers, which run one after another
                d.scratch = decode_scratch(d.rows.shape[0], queries.shape[1], k_pool.shape[1], queries.shape[2],
                                           queries.device)
            decode_attention(queries, k_pool, v_pool, table, d.rows, d.lengths, d.q_rows, out, *d.scratch, scale)
        if self.extend is not None:
            e = self.extend
            extend_attention(queries, k_pool, v_pool, table, e.rows, e.prefix_lens, e.new_lens, e.q_starts,
                             e.max_new, out, scale)
        return out[None]


class TritonBackend:
    def __init__(self, pool: KVPool, max_sequences: int):
        device = pool.k.device
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("engine.attention_backend: triton runs on a CUDA device (or under Triton's interpreter, "
                             "TRITON_INTERPRET=1); use sdpa on the CPU")
        self.pool = pool
        self.device = device
        self.scale = pool.k.shape[3] ** -0.5
        self.table = SlotTable(max_sequences, pool.max_context, device)

    def context(self, sequences: list[SequenceSlots]) -> TritonAttention:
        """The eager path: any mix of decode rows and prefills (chunks over a cached prefix)."""
        plan = self.table.prepare(sequences)
        new_slots, decode_at, extend_at = [], [], []
        start = 0
        for index, seq in enumerate(sequences):
            new_slots.extend(seq.context_slots[len(seq.context_slots) - seq.num_new:])
            (decode_at if seq.num_new == 1 else extend_at).append((index, start))
            start += seq.num_new
        lengths = [len(seq.context_slots) for seq in sequences]
        news = [seq.num_new for seq in sequences]
        parts = [
            plan.write_index + plan.new_index, plan.write_slots + new_slots, new_slots,
            [at for _, at in decode_at], [plan.rows[i] for i, _ in decode_at], [lengths[i] for i, _ in decode_at],
            [plan.rows[i] for i, _ in extend_at], [lengths[i] - news[i] for i, _ in extend_at],
            [news[i] for i, _ in extend_at], [at for _, at in extend_at],
        ]
        # one host-to-device copy for every index of the forward
        flat = torch.tensor([x for part in parts for x in part], dtype=torch.long, device=self.device)
        (write_index, write_slots, new, q_rows, rows, lens,
         e_rows, e_prefix, e_new, e_starts) = flat.split([len(part) for part in parts])
        self.write(write_index, write_slots)
        decode = extend = None
        if decode_at:
            decode = _Decode(q_rows, rows, lens)
        if extend_at:
            extend = _Extend(e_rows, e_prefix, e_new, e_starts, max(news[i] for i, _ in extend_at))
        return TritonAttention(self, new, decode, extend)

    def decode_step(self, sequences: list[SequenceSlots], token_ids: list[int], positions: list[int]) -> DecodeStep:
        """A decode-only forward's inputs as host lists for a CUDA graph's static buffers; the
        table's writes before the new tokens (none for a request that decoded last step) are
        applied here."""
        plan = self.table.prepare(sequences)
        if plan.write_index:
            flat = torch.tensor(plan.write_index + plan.write_slots, dtype=torch.long, device=self.device)
            self.write(*flat.split(len(plan.write_index)))
        return DecodeStep(token_ids, positions, [seq.context_slots[-1] for seq in sequences], plan.new_index,
                          plan.rows, [len(seq.context_slots) for seq in sequences])

    def decode_context(self, new_slots: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor,
                       q_rows: torch.Tensor) -> TritonAttention:
        """A decode-only context over given device tensors (a CUDA graph's static buffers);
        the caller writes the new tokens' table entries (`write`) before the forward."""
        decode = _Decode(q_rows, rows, lengths)
        return TritonAttention(self, new_slots, decode, None)

    def write(self, index: torch.Tensor, slots: torch.Tensor) -> None:
        """Table entries (flat `index`) set to `slots`, on the device."""
        self.table.table.view(-1).index_copy_(0, index, slots)

    @property
    def padding(self) -> tuple[int, int]:
        """(table index, table row) of a padding row: the scratch row, which nothing reads."""
        return self.table.scratch_index, self.table.scratch_row
