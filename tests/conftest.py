import os

import pytest

from venusrl.model.tiny import make_tiny_model

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The default tiny Qwen3 directory (GQA, tied embeddings), built once per session."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"), seed=1)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from venusrl.model.chat import load_tokenizer

    return load_tokenizer(tiny_model_dir)
