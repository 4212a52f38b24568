"""Every way a checkpoint directory can be wrong gives an error naming the file and field."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from venusrl.model.args import ModelConfigError
from venusrl.model.checkpoint import SINGLE_FILE, load_model
from venusrl.model.tiny import make_tiny_model


@pytest.fixture
def model_dir(tmp_path):
    return make_tiny_model(tmp_path / "m", layers=1, tie_word_embeddings=False)


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_missing_directory(tmp_path):
    with pytest.raises(ModelConfigError, match="config.json: not found"):
        load_model(tmp_path / "nowhere")


def test_invalid_config_json_names_line(model_dir):
    (model_dir / "config.json").write_text('{\n  "model_type": "qwen3",\n  oops\n}')
    with pytest.raises(ModelConfigError, match=r"config.json:3: invalid JSON"):
        load_model(model_dir)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"hidden_size": "64"}, "hidden_size must be a positive integer"),
        ({"num_key_value_heads": 3}, r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "rope_type 'longrope' is not supported"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 2.0}}, "rope_scaling.low_freq_factor is required"),
    ],
)
def test_bad_config_values(model_dir, changes, message):
    _edit_config(model_dir, **changes)
    with pytest.raises(ModelConfigError, match=message):
        load_model(model_dir)


def test_missing_tensor(model_dir):
    state = load_file(model_dir / SINGLE_FILE)
    del state["model.layers.0.mlp.up_proj.weight"]
    save_file(state, model_dir / SINGLE_FILE)
    with pytest.raises(ModelConfigError, match="lacks 1 tensors.*up_proj"):
        load_model(model_dir)


def test_shape_mismatch(model_dir):
    state = load_file(model_dir / SINGLE_FILE)
    state["model.norm.weight"] = torch.ones(7)
    save_file(state, model_dir / SINGLE_FILE)
    with pytest.raises(ModelConfigError, match=r"'model.norm.weight' has shape \(7,\)"):
        load_model(model_dir)


def test_unexpected_tensor(model_dir):
    state = load_file(model_dir / SINGLE_FILE)
    state["model.layers.9.mlp.up_proj.weight"] = torch.ones(2, 2)
    save_file(state, model_dir / SINGLE_FILE)
    with pytest.raises(ModelConfigError, match="unexpected tensor 'model.layers.9"):
        load_model(model_dir)


def test_missing_shard(tmp_path):
    path = make_tiny_model(tmp_path, max_shard_bytes=40_000)
    next(path.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(ModelConfigError, match="model-00002-.*weight file not found"):
        load_model(path)


def test_v5_rope_parameters_layout_is_read(model_dir):
    _edit_config(model_dir, rope_parameters={"rope_theta": 5000.0, "rope_type": "default"})
    assert load_model(model_dir).args.rope_theta == 5000.0
