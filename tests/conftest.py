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


@pytest.fixture(scope="session")
def tool_calling_model_dir(tmp_path_factory):
    """A tiny model that really emits a tool call (see tests/engine/tool_model.py)."""
    from tests.engine.tool_model import teach_tool_call

    return teach_tool_call(tmp_path_factory.mktemp("tool-model"))
