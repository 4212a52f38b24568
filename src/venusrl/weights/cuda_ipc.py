"""Weights to engine processes on the same host when they are on a GPU: the pushing process
packs one push into a device buffer (a device-to-device copy, cast to the engine's dtype)
and hands the engines a CUDA IPC handle of that buffer; each engine opens the handle once
(it is kept across pushes: the buffer is reused) and copies from it into its parameters,
device to device. Only the handle, the layout and the version cross the socket.

The handle is what torch.multiprocessing shares CUDA tensors with (`reduce_tensor`), sent
as JSON (bytes in base64), never pickled. Same invariant as shared memory: the buffer is
rewritten only after every engine acknowledged the previous push (`WeightPusher`'s lock),
and the pushing process synchronises its stream before sending the handle, so an engine
reads a whole push.
"""

from __future__ import annotations

import base64
from typing import Any

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from venusrl.weights.layout import WeightLayout

# the fields of rebuild_cuda_tensor's arguments past (cls, size, stride, offset, storage_cls, dtype)
_HANDLE_FIELDS = ("device", "handle", "size_bytes", "offset_bytes", "requires_grad", "ref_counter_handle",
                  "ref_counter_offset", "event_handle", "event_sync_required")


def _to_json(value: Any) -> Any:
    return {"b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def _from_json(value: Any) -> Any:
    return base64.b64decode(value["b64"]) if isinstance(value, dict) and "b64" in value else value


class CudaIpcWriter:
    """The pushing process's device buffer and its handle, kept across pushes."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.handle: dict[str, Any] | None = None

    def write(self, weights: dict[str, torch.Tensor], layout: WeightLayout, device: torch.device) -> dict:
        """Pack `weights` into the buffer on `device`; the message fields an engine needs."""
        if self.buffer is None or self.buffer.numel() < layout.nbytes or self.buffer.device != device:
            self.buffer = torch.empty(max(layout.nbytes, 1), dtype=torch.uint8, device=device)
            rebuild, args = reduce_tensor(self.buffer)
            if rebuild is not rebuild_cuda_tensor:
                raise ValueError(f"cuda_ipc: the weight buffer is on {device}, not on a GPU")
            self.handle = {name: _to_json(value) for name, value in zip(_HANDLE_FIELDS, args[6:], strict=True)}
            self.handle["numel"] = self.buffer.numel()
        layout.pack(weights, self.buffer)
        torch.cuda.current_stream(device).synchronize()  # the engines read it from other processes
        return {"handle": self.handle}

    def close(self) -> None:
        self.buffer, self.handle = None, None


class CudaIpcReader:
    """An engine process's view of the pushing process's buffer, opened once per handle."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.buffer: torch.Tensor | None = None

    def views(self, handle: Any, layout: WeightLayout) -> dict[str, torch.Tensor]:
        if not isinstance(handle, dict) or not set(_HANDLE_FIELDS) | {"numel"} <= set(handle):
            raise ValueError(f"cuda_ipc: handle must carry {', '.join(_HANDLE_FIELDS)} and numel")
        fields = {name: _from_json(handle[name]) for name in _HANDLE_FIELDS}
        numel = handle["numel"]
        if not isinstance(numel, int) or numel < layout.nbytes:
            raise ValueError(f"cuda_ipc: buffer of {numel} bytes is smaller than the push's {layout.nbytes}")
        key = (fields["handle"], fields["offset_bytes"])
        if key != self.key:
            self.buffer = rebuild_cuda_tensor(torch.Tensor, (numel,), (1,), 0, torch.TypedStorage, torch.uint8,
                                              *fields.values())
            self.key = key
        return layout.views(self.buffer)
