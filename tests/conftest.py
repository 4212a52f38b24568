import os

import pytest
import torch
from hypothesis import settings

from venusrl.model.tiny import make_tiny_model

# No property test asserts time (timing belongs in benchmarks): hypothesis's per-example
# deadline made a loaded 2-core machine fail a correct test (StepLog, 250 ms against 200).
settings.register_profile("venusrl", deadline=None)
settings.load_profile("venusrl")

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Without a GPU the Triton kernels run under Triton's interpreter, on CPU tensors; it is chosen
# when the kernels are defined (imported), so it is set before any test imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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


@pytest.fixture(scope="session")
def real_model_dirs(tmp_path_factory):
    """Small random-weight models over the official Qwen3, Qwen2.5 and Llama 3.1 tokenizers
    (tests/real_tokenizers.py), each built on first use."""
    from tests.real_tokenizers import make_real_vocab_model

    built = {}

    def get(name: str):
        if name not in built:
            built[name] = make_real_vocab_model(tmp_path_factory.mktemp(f"real-{name}"), name)
        return built[name]

    return get


@pytest.fixture(scope="session")
def qwen3_model_dir(real_model_dirs):
    return real_model_dirs("qwen3")


@pytest.fixture(scope="session")
def qwen3_tokenizer(qwen3_model_dir):
    from venusrl.model.chat import load_tokenizer

    return load_tokenizer(qwen3_model_dir)


@pytest.fixture(scope="session")
def qwen3_tool_model_dir(tmp_path_factory):
    """A small model over the official Qwen3 tokenizer and template that really thinks, then
    calls a tool (tests/engine/tool_model.py)."""
    from tests.engine.tool_model import THINKING_REPLY, teach_reply
    from tests.real_tokenizers import make_real_vocab_model

    return teach_reply(make_real_vocab_model(tmp_path_factory.mktemp("qwen3-tool-model"), "qwen3", seed=4),
                       THINKING_REPLY, lr=1e-2)
