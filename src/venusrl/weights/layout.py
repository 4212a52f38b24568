"""Where each tensor of a weight push lies in one flat byte buffer: what the shared-memory,
CUDA IPC and broadcast transports fill once on the trainer's side and map on the engine's.

A layout is the names, dtypes, shapes and byte offsets of a state dict's tensors in the
engine's dtype (floating tensors are cast on packing; the trainer may hold fp32 masters),
each starting on an `ALIGN`-byte boundary. Tensors that share storage in the source (tied
embeddings: `lm_head.weight` is `model.embed_tokens.weight`) are packed once and named as
aliases, so a push never carries the same bytes twice. It crosses the wire as JSON; nothing
is unpickled."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from venusrl.engine.remote.wire import DTYPES  # the dtypes a tensor may cross a process boundary in
from venusrl.weights.copy import copy_into

ALIGN = 256  # bytes: a cache line on the host, the allocation granule of CUDA's caching allocator


@dataclass(frozen=True, slots=True)
class TensorSlot:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # bytes from the buffer's start

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class WeightLayout:
    slots: tuple[TensorSlot, ...]
    aliases: tuple[tuple[str, str], ...]  # (name, name of the slot it shares)
    nbytes: int

    @classmethod
    def of(cls, state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> WeightLayout:
        """The layout of `state_dict` with its floating tensors in `dtype` (None: as they are)."""
        slots, aliases, first_of, offset = [], [], {}, 0
        for name, tensor in state_dict.items():
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.device)
            if tensor.numel() and key in first_of:
                aliases.append((name, first_of[key]))
                continue
            first_of[key] = name
            offset += -offset % ALIGN
            cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
            slot = TensorSlot(name, cast, tuple(tensor.shape), offset)
            slots.append(slot)
            offset += slot.nbytes
        return cls(tuple(slots), tuple(aliases), offset)

    def pack(self, state_dict: Mapping[str, torch.Tensor], buffer: torch.Tensor) -> None:
        """Copy (and cast) every tensor into its place in `buffer` (uint8, `nbytes` long, on any
        device: the copy runs on the buffer's device)."""
        views = self.views(buffer)
        with torch.no_grad():
            for slot in self.slots:
                copy_into(views[slot.name], state_dict[slot.name].detach())

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each tensor as a view into `buffer` (aliases too), no copy."""
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < self.nbytes:
            raise ValueError(f"weight buffer must be 1-d uint8 of at least {self.nbytes} bytes, "
                             f"got {buffer.dtype} of shape {tuple(buffer.shape)}")
        views = {slot.name: buffer[slot.offset: slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)
                 for slot in self.slots}
        for name, target in self.aliases:
            views[name] = views[target]
        return views

    def to_wire(self) -> dict[str, Any]:
        return {"slots": [[s.name, str(s.dtype).removeprefix("torch."), list(s.shape), s.offset] for s in self.slots],
                "aliases": [list(pair) for pair in self.aliases], "nbytes": self.nbytes}

    @classmethod
    def from_wire(cls, value: Any) -> WeightLayout:
        """The layout a message carries; ValueError naming the tensor or field that is wrong
        (a slot past the buffer, overlapping slots, an unknown dtype, an alias of nothing)."""
        if not isinstance(value, dict) or not {"slots", "aliases", "nbytes"} <= set(value):
            raise ValueError("weight layout must be an object with slots, aliases and nbytes")
        nbytes = value["nbytes"]
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ValueError(f"weight layout: nbytes must be a size, got {str(nbytes)[:40]}")
        slots, end = [], 0
        for spec in value["slots"] if isinstance(value["slots"], list) else [None]:
            if not (isinstance(spec, list) and len(spec) == 4 and isinstance(spec[0], str)):
                raise ValueError(f"weight layout: slot {str(spec)[:80]} is not [name, dtype, shape, offset]")
            name, dtype, shape, offset = spec
            if dtype not in DTYPES:
                raise ValueError(f"weight layout: tensor {name!r} has dtype {str(dtype)[:40]!r}, not one of "
                                 f"{', '.join(DTYPES)}")
            if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                     for d in shape)):
                raise ValueError(f"weight layout: tensor {name!r} has shape {str(shape)[:80]}, not a list of sizes")
            slot = TensorSlot(name, DTYPES[dtype], tuple(shape), offset)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < end or offset % ALIGN:
                raise ValueError(f"weight layout: tensor {name!r} at offset {str(offset)[:40]} overlaps the one "
                                 f"before it or is not {ALIGN}-byte aligned")
            end = offset + slot.nbytes
            if end > nbytes:
                raise ValueError(f"weight layout: tensor {name!r} ends at byte {end}, past the {nbytes}-byte buffer")
            slots.append(slot)
        names = {s.name for s in slots}
        aliases = value["aliases"] if isinstance(value["aliases"], list) else [None]
        for pair in aliases:
            if not (isinstance(pair, list) and len(pair) == 2 and pair[1] in names and isinstance(pair[0], str)):
                raise ValueError(f"weight layout: alias {str(pair)[:80]} is not [name, name of a packed tensor]")
        return cls(tuple(slots), tuple((a, b) for a, b in aliases), nbytes)
