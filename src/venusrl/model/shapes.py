"""The official Qwen3 models' shapes (config.json of Qwen/Qwen3-0.6B, -4B and -8B), for the
benchmarks that build random weights of a real model's shape here (nothing is downloaded);
`tiny` is for smoke tests on a CPU. One table: the engine, trainer and weight-push benchmarks
read the same shapes."""

from __future__ import annotations

from typing import Any

QWEN3_VOCAB = 151_936

QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, tie=True,
                       vocab=QWEN3_VOCAB),
    "qwen3-4b": dict(layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128, intermediate=9728, tie=True,
                     vocab=QWEN3_VOCAB),
    "qwen3-8b": dict(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288, tie=False,
                     vocab=QWEN3_VOCAB),
    "tiny": dict(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256, tie=True, vocab=1024),
}


def hf_config_fields(shape: dict[str, Any]) -> dict[str, Any]:
    """The shape as Hugging Face's Qwen3 config.json names its fields."""
    return dict(num_hidden_layers=shape["layers"], hidden_size=shape["hidden"], num_attention_heads=shape["heads"],
                num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                intermediate_size=shape["intermediate"], vocab_size=shape["vocab"],
                tie_word_embeddings=shape["tie"], max_window_layers=shape["layers"])


def qwen3_config(shape: dict[str, Any]) -> dict[str, Any]:
    """A whole Qwen3 config.json of `shape`: the official configs' other fields, and the
    vocabulary's last two ids as end of sequence and padding (random weights need no tokenizer)."""
    vocab = shape["vocab"]
    return dict(model_type="qwen3", **hf_config_fields(shape), hidden_act="silu", max_position_embeddings=40960,
                rms_norm_eps=1e-6, rope_theta=1_000_000.0, rope_scaling=None, attention_bias=False,
                use_sliding_window=False, sliding_window=None, eos_token_id=vocab - 1, pad_token_id=vocab - 2,
                bos_token_id=None, initializer_range=0.02)
