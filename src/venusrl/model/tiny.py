"""A complete, tiny Hugging Face model directory built locally: config.json, random
weights, a byte-level tokenizer.json, tokenizer and generation configs, a chat template."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from venusrl.model.args import ModelArgs
from venusrl.model.causal_lm import CausalLM
from venusrl.model.checkpoint import save_weights

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


def chat_template() -> str:
    return resources.files("venusrl.model").joinpath("chat_template.jinja").read_text()


def build_byte_tokenizer() -> Tokenizer:
    """Every byte is one token (ids 0..255), then the special tokens; no merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def make_tiny_model(
    path: str | Path,
    *,
    arch: Literal["qwen3", "qwen2", "llama"] = "qwen3",
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate: int | None = None,
    tie_word_embeddings: bool = True,
    rope_theta: float = 1_000_000.0,
    rope_scaling: dict[str, Any] | None = None,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    max_shard_bytes: int | None = None,
) -> Path:
    if arch not in _ARCHITECTURES:
        raise ValueError(f"arch {arch!r} is not one of {', '.join(_ARCHITECTURES)}")
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}) and heads by kv_heads ({kv_heads})")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_byte_tokenizer()
    token_id = tokenizer.token_to_id
    config = {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": hidden,
        "intermediate_size": intermediate or 3 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim or hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": token_id("<|im_end|>"),
        "pad_token_id": token_id("<|endoftext|>"),
        "use_cache": True,
        "torch_dtype": "float32",
    }
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=layers)
    if arch == "qwen3":
        config.update(attention_bias=False)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_weights(_random_model(ModelArgs.from_hf(config), seed), path, max_shard_bytes)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": max_position_embeddings,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "unk_token": None,
                "add_bos_token": False,
                "clean_up_tokenization_spaces": False,
                "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
                "chat_template": chat_template(),
            },
            indent=2,
        )
    )
    (path / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": None,
                "eos_token_id": [token_id("<|im_end|>"), token_id("<|endoftext|>")],
                "pad_token_id": token_id("<|endoftext|>"),
                "do_sample": False,
            },
            indent=2,
        )
    )
    return path


def _random_model(args: ModelArgs, seed: int) -> CausalLM:
    """Weights scaled so that logits are far from uniform: greedy decoding then has no
    near-ties, and norm weights differ from 1 so that loading them is actually tested."""
    generator = torch.Generator().manual_seed(seed)
    model = CausalLM(args)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(0.5 + torch.rand(param.shape, generator=generator))
            elif param.dim() == 2:
                fan_in = param.shape[1]
                std = 0.1 if "embed_tokens" in name else 1.0 / math.sqrt(fan_in)
                param.copy_(torch.randn(param.shape, generator=generator) * std)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return model
