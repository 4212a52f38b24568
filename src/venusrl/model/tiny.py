"""A complete, tiny Hugging Face model directory built locally: config.json, random
weights, tokenizer and generation configs, a chat template. The tokenizer is either our
byte-level one, or a real checkpoint's (`tokenizer_dir`: its tokenizer.json and
tokenizer_config.json, chat template included, copied as they are; the embedding then spans
the real vocabulary)."""

from __future__ import annotations

import json
import math
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NamedTuple

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
# Tokens that end a turn or a document in the checkpoints we support; those a real tokenizer
# has become the generation config's eos ids, as in the official generation_config.json files.
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
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
    tokenizer_dir: str | Path | None = None,
) -> Path:
    if arch not in _ARCHITECTURES:
        raise ValueError(f"arch {arch!r} is not one of {', '.join(_ARCHITECTURES)}")
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}) and heads by kv_heads ({kv_heads})")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(path, max_position_embeddings, tokenizer_dir)
    config = {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab.size,
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
        "bos_token_id": vocab.bos_id,
        "eos_token_id": vocab.eos_ids[0],
        "pad_token_id": vocab.pad_id,
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
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": vocab.bos_id, "eos_token_id": list(vocab.eos_ids), "pad_token_id": vocab.pad_id,
         "do_sample": False}, indent=2))
    return path


class _Vocabulary(NamedTuple):
    size: int  # rows of the embedding: the tokenizer's length rounded up, as real checkpoints pad it
    eos_ids: tuple[int, ...]
    pad_id: int
    bos_id: int | None


def _write_tokenizer(path: Path, max_length: int, tokenizer_dir: str | Path | None) -> _Vocabulary:
    if tokenizer_dir is None:
        tokenizer = build_byte_tokenizer()
        tokenizer.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
            "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None,
            "add_bos_token": False, "clean_up_tokenization_spaces": False,
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]), "chat_template": chat_template(),
        }, indent=2))
        ids = tokenizer.token_to_id
        return _Vocabulary(tokenizer.get_vocab_size(), (ids("<|im_end|>"), ids("<|endoftext|>")),
                           ids("<|endoftext|>"), None)
    source = Path(tokenizer_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (source / name).is_file():
            raise ValueError(f"tokenizer_dir {source}: no {name}")
        shutil.copyfile(source / name, path / name)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(path))
    if not hf.chat_template:
        raise ValueError(f"tokenizer_dir {source}: tokenizer_config.json has no chat_template")
    vocab = hf.get_vocab()
    eos = [hf.eos_token_id] if hf.eos_token_id is not None else []
    eos += [vocab[t] for t in _END_TOKENS if t in vocab and vocab[t] not in eos]
    if not eos:
        raise ValueError(f"tokenizer_dir {source}: no end-of-turn token (eos_token or one of {', '.join(_END_TOKENS)})")
    pad = hf.pad_token_id if hf.pad_token_id is not None else eos[-1]
    return _Vocabulary(-(-len(hf) // 128) * 128, tuple(eos), pad, hf.bos_token_id)


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
