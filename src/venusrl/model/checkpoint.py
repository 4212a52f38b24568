"""Read and write Hugging Face checkpoint directories (config.json + safetensors)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from venusrl.model.args import ModelArgs, ModelConfigError
from venusrl.model.causal_lm import CausalLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def load_model(path: str | Path, dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu") -> CausalLM:
    """Build the model from config.json and load single or sharded safetensors weights."""
    path = Path(path)
    args = ModelArgs.from_dir(path)
    dtype = resolve_dtype(dtype)
    with torch.device("meta"):
        model = CausalLM(args)
    model = model.to_empty(device=device).to(dtype)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    expected = dict(model.named_parameters())
    seen: set[str] = set()
    with torch.no_grad():
        for shard in weight_files(path):
            with safe_open(str(shard), framework="pt", device=str(device)) as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
                    if name.endswith("rotary_emb.inv_freq"):
                        continue
                    if name == "lm_head.weight" and args.tie_word_embeddings:
                        continue
                    if name not in expected:
                        raise ModelConfigError(f"{shard.name}: unexpected tensor {name!r} for a {args.model_type} model")
                    tensor = f.get_tensor(name)
                    if tuple(tensor.shape) != tuple(expected[name].shape):
                        raise ModelConfigError(
                            f"{shard.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                            f"config.json implies {tuple(expected[name].shape)}"
                        )
                    expected[name].copy_(tensor)
                    seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        raise ModelConfigError(f"{path}: checkpoint lacks {len(missing)} tensors, first: {missing[:3]}")
    model.reset_rope()
    return model.eval()


def weight_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise ModelConfigError(f"{index}: not a safetensors index ({err})") from None
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        files = [path / SINGLE_FILE]
    for file in files:
        if not file.exists():
            raise ModelConfigError(f"{file}: weight file not found")
    return files


def save_weights(model: CausalLM, path: str | Path, max_shard_bytes: int | None = None) -> None:
    """Write the weights as Hugging Face does: tied lm_head omitted; sharded with an index
    when the tensors exceed `max_shard_bytes`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {
        name: tensor.detach().contiguous().cpu()
        for name, tensor in model.state_dict().items()
        if not (name == "lm_head.weight" and model.args.tie_word_embeddings)
    }
    total = sum(t.numel() * t.element_size() for t in state.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        save_file(state, str(path / SINGLE_FILE), metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    (path / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "generation_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "added_tokens.json")


def copy_tokenizer_files(source: str | Path, target: str | Path) -> None:
    """Copy what a model directory needs besides config and weights (tokenizer, chat
    template, generation config) so the target loads on its own."""
    source, target = Path(source), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, target / name)
