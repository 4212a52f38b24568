"""The tiny directory is a real Hugging Face model directory."""

import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from venusrl.model.chat import load_tokenizer
from venusrl.model.tiny import SPECIAL_TOKENS


def test_directory_has_every_file(tiny_model_dir):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tiny_model_dir / name).exists(), name
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["vocab_size"] == 256 + len(SPECIAL_TOKENS)


def test_transformers_loads_it_offline_in_a_fresh_process(tiny_model_dir):
    code = (
        "import sys, transformers;"
        "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]);"
        "t = transformers.AutoTokenizer.from_pretrained(sys.argv[1]);"
        "print(type(m).__name__, len(t))"
    )
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code, str(tiny_model_dir)], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split()[-2:] == ["Qwen3ForCausalLM", str(256 + len(SPECIAL_TOKENS))]


def test_special_tokens_are_single_ids(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for token in SPECIAL_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert tokenizer.eos_token == "<|im_end|>"


def test_chat_template_renders_tools_and_tool_calls(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "1+2"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "3"},
    ]
    text = tokenizer.render(messages, tools, add_generation_prompt=True)
    assert '<tools>\n{"type": "function", "function": {"name": "add"' in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><|im_end|>' in text
    assert text.endswith("<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_byte_level_round_trip(tiny_tokenizer, text):
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text
