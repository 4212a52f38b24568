"""A fingerprint of an engine's weights: sha256 over each parameter's name, dtype, shape and
bytes, in name order. Two engines (or an engine and the trainer's weights cast to the
engine's dtype) hold bit-identical weights exactly when their digests agree; it is how a
push is checked end to end without moving the weights back."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def weight_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def engine_weights_digest(model: torch.nn.Module) -> str:
    """The digest of an engine model's parameters by Hugging Face name (a tied lm_head once,
    under its embedding's name, as `named_parameters` lists it)."""
    return weight_digest(dict(model.named_parameters()))


def expected_digest(weights: Mapping[str, torch.Tensor], dtype: torch.dtype, tied: bool) -> str:
    """What `engine_weights_digest` gives after a push of `weights` into an engine of `dtype`."""
    return weight_digest({name: tensor.to(dtype) for name, tensor in weights.items()
                          if not (tied and name == "lm_head.weight")})
