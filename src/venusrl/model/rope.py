"""Rotary position embedding with the checkpoint's theta and scaling.

Supported `rope_type`s: default, linear, llama3, yarn. Each returns inverse frequencies
and a factor applied to cos/sin (YaRN's attention scaling; 1.0 elsewhere).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from venusrl.model.args import ModelArgs, ModelConfigError


def rope_inv_freq(args: ModelArgs) -> tuple[torch.Tensor, float]:
    dim = args.head_dim
    base = args.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = args.rope_scaling
    if scaling is None:
        return inv_freq, 1.0
    rope_type = scaling["rope_type"]
    if rope_type == "linear":
        return inv_freq / _require(scaling, "factor"), 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    if rope_type == "yarn":
        return _yarn(args, scaling)
    raise ModelConfigError(
        f"config.json: rope_scaling.rope_type {rope_type!r} is not supported (default, linear, llama3, yarn)"
    )


def _require(scaling: dict[str, Any], key: str) -> float:
    if key not in scaling:
        raise ModelConfigError(f"config.json: rope_scaling.{key} is required for rope_type {scaling['rope_type']!r}")
    return float(scaling[key])


def _llama3(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between."""
    factor = _require(scaling, "factor")
    low_freq_factor = _require(scaling, "low_freq_factor")
    high_freq_factor = _require(scaling, "high_freq_factor")
    old_context = _require(scaling, "original_max_position_embeddings")
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


def _yarn(args: ModelArgs, scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, with a linear ramp between
    the correction dims given by beta_fast and beta_slow; cos/sin scaled by mscale."""
    dim, base = args.head_dim, args.rope_theta
    factor = _require(scaling, "factor")
    original_max = scaling.get("original_max_position_embeddings") or args.max_position_embeddings

    def mscale_of(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim)
        else:
            attention_factor = mscale_of(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, float(attention_factor)


class RotaryEmbedding(torch.nn.Module):
    """cos/sin for given positions; `inv_freq` is a non-persistent buffer (not in checkpoints)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        inv_freq, self.attention_scaling = rope_inv_freq(args)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed_sin), each [B, T, 1, D] to broadcast over heads. signed_sin is
        (-sin, sin) over the two halves, which folds rotate_half's negation into the table
        so `apply_rotary` is a roll and two products (bit-identical to Hugging Face's)."""
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq.to(positions.device)
        cos = torch.cat((freqs, freqs), dim=-1).cos() * self.attention_scaling
        sin = freqs.sin() * self.attention_scaling
        signed_sin = torch.cat((-sin, sin), dim=-1)
        return cos.to(dtype)[:, :, None], signed_sin.to(dtype)[:, :, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos, signed_sin: [B, T, 1, D] from `RotaryEmbedding`.
    rotate_half(x) * sin == roll(x, D/2) * signed_sin."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
