"""Peak bytes of the tensors a piece of torch code allocates, on any device, the meta device
included (shapes without memory: the peak of a computation too large to run here).

Every tensor an operator returns is seen through a `TorchDispatchMode`; a storage none of the
operator's inputs had is new, and counted from then until it is freed (a weak reference's
callback). Views and in-place results share a counted (or pre-existing) storage and add
nothing. This counts what the code asks for, not what an allocator caches or rounds to: on CUDA,
`torch.cuda.max_memory_allocated` is the allocator's figure for the same thing.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class TensorMemory(TorchDispatchMode):
    """`with TensorMemory() as memory: ...` then `memory.peak_bytes` (and `live_bytes`, what is
    still alive of what was allocated inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._alive: dict[int, weakref.ref] = {}  # storage identity -> weak reference (its callback frees)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                key = _key(tensor)
                if key not in inputs and key not in self._alive:
                    self._count(tensor.untyped_storage(), key)
        return out

    def _count(self, storage: torch.UntypedStorage, key: int) -> None:
        size = storage.nbytes()
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

        def freed(_: weakref.ref) -> None:
            self.live_bytes -= size
            self._alive.pop(key, None)

        self._alive[key] = weakref.ref(storage, freed)


def _key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata
