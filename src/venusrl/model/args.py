"""Architecture hyper-parameters read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# model_type -> whether attention has q/k RMSNorm and whether q/k/v projections carry a bias
_FAMILIES = {
    "qwen3": {"qk_norm": True, "attention_bias": False},
    "qwen2": {"qk_norm": False, "attention_bias": True},
    "llama": {"qk_norm": False, "attention_bias": False},
    "mistral": {"qk_norm": False, "attention_bias": False},
}


class ModelConfigError(ValueError):
    """config.json describes something this model layer cannot run; names the field."""


@dataclass(slots=True, frozen=True)
class ModelArgs:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool
    attention_bias: bool
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelArgs:
        model_type = config.get("model_type")
        if model_type not in _FAMILIES:
            raise ModelConfigError(
                f"config.json: model_type {model_type!r} is not supported (supported: {', '.join(_FAMILIES)})"
            )
        if config.get("use_sliding_window"):
            raise ModelConfigError("config.json: use_sliding_window=true is not supported")
        family = _FAMILIES[model_type]
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if not isinstance(config.get(key), int) or config[key] <= 0:
                raise ModelConfigError(f"config.json: {key} must be a positive integer, got {config.get(key)!r}")
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ModelConfigError(
                f"config.json: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )
        rope_theta, rope_scaling = _rope(config)
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            model_type=model_type,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=family["qk_norm"],
            attention_bias=bool(config.get("attention_bias", family["attention_bias"])),
            mlp_bias=bool(config.get("mlp_bias", False)),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelArgs:
        config_path = Path(path) / "config.json"
        try:
            config = json.loads(config_path.read_text())
        except FileNotFoundError:
            raise ModelConfigError(f"{config_path}: not found; is {path} a Hugging Face model directory?") from None
        except json.JSONDecodeError as err:
            raise ModelConfigError(f"{config_path}:{err.lineno}: invalid JSON ({err.msg})") from None
        return cls.from_hf(config)


def _rope(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """Theta and scaling from either layout: transformers 4 (`rope_theta` + `rope_scaling`)
    or transformers 5 (`rope_parameters` holding both)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict):
        theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = config.get("rope_theta", 10000.0)
        scaling = dict(config.get("rope_scaling") or {})
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    if rope_type == "default":
        return float(theta), None
    return float(theta), {"rope_type": rope_type, **scaling}
