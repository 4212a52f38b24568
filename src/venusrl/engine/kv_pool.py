"""KV tensors: the device pool the runner attends over, and host memory for KV that leaves
it (exported for migration to another engine, or parked while a trajectory waits).

Slot ids are the integers the pure scheduler hands out (`kv_slots.py`); this module owns
only the tensors behind them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from venusrl.engine.batch import KVCopy
from venusrl.model.args import ModelArgs


class KVPool:
    """k, v: [layers, slots, kv_heads, head_dim], allocated once. Which slots form a page is
    the allocator's business (`kv_slots.py`); this pool addresses slots only."""

    def __init__(self, args: ModelArgs, num_slots: int, dtype: torch.dtype, device: torch.device | str,
                 host_slots: int = 0):
        shape = (args.num_hidden_layers, num_slots, args.num_key_value_heads, args.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        # the longest context a sequence can have here: the pool's slots or the model's positions
        self.max_context = min(num_slots, args.max_position_embeddings)
        # the host tier (`host_tier.py`); pinned when the pool is on a GPU so copies are async-capable
        host_shape = (args.num_hidden_layers, host_slots, args.num_key_value_heads, args.head_dim)
        pin = torch.device(device).type == "cuda"
        self.host_k = torch.zeros(host_shape, dtype=dtype, pin_memory=pin)
        self.host_v = torch.zeros(host_shape, dtype=dtype, pin_memory=pin)

    def copy(self, copy: KVCopy) -> None:
        """One device <-> host tier copy (slot i to slot i, every layer)."""
        device = torch.tensor(copy.device_slots, dtype=torch.long, device=self.k.device)
        host = torch.tensor(copy.host_slots, dtype=torch.long)
        if copy.to_host:
            self.host_k[:, host] = self.k[:, device].to("cpu")
            self.host_v[:, host] = self.v[:, device].to("cpu")
        else:
            self.k[:, device] = self.host_k[:, host].to(self.k.device)
            self.v[:, device] = self.host_v[:, host].to(self.v.device)

    @property
    def bytes_per_token(self) -> int:
        layers, _, heads, dim = self.k.shape
        return 2 * layers * heads * dim * self.k.element_size()

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def export(self, slots: list[int]) -> HostKV:
        """Copy the KV of `slots` (in token order) to host memory."""
        index = torch.tensor(slots, dtype=torch.long, device=self.k.device)
        return HostKV(self.k[:, index].to("cpu", copy=True), self.v[:, index].to("cpu", copy=True))

    def check_compatible(self, kv: HostKV) -> None:
        """Same layers, KV heads and head size: KV from another model does not fit."""
        if kv.k.shape[0] != self.k.shape[0] or kv.k.shape[2:] != self.k.shape[2:]:
            raise ValueError(f"host KV shape {tuple(kv.k.shape)} does not fit pool {tuple(self.k.shape)}")

    def load(self, slots: list[int], kv: HostKV) -> None:
        """Write host KV (in token order) into `slots`."""
        if kv.num_tokens != len(slots):
            raise ValueError(f"host KV holds {kv.num_tokens} tokens, {len(slots)} slots given")
        self.check_compatible(kv)
        index = torch.tensor(slots, dtype=torch.long, device=self.k.device)
        self.k[:, index] = kv.k.to(self.k.device, self.k.dtype)
        self.v[:, index] = kv.v.to(self.v.device, self.v.dtype)


@dataclass(slots=True)
class HostKV:
    """KV of a run of tokens in host memory: k, v [layers, tokens, kv_heads, head_dim]."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.k.shape[1]

    def slice(self, start: int, end: int) -> HostKV:
        return HostKV(self.k[:, start:end], self.v[:, start:end])
