"""Tokenizer with its chat template, loaded from a Hugging Face directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

_ROLES = ("system", "user", "assistant", "tool")


class ChatTokenizer:
    """A Hugging Face tokenizer plus what the agent loop needs from it: rendering through
    the checkpoint's own chat template, and the ids that end a turn."""

    def __init__(self, hf: PreTrainedTokenizerBase, eos_token_ids: tuple[int, ...]):
        if not hf.chat_template:
            raise ValueError(f"tokenizer {hf.name_or_path!r} has no chat template")
        self.hf = hf
        self.eos_token_ids = eos_token_ids

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def encode_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Prompt ids of a conversation, ending with the generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        validate_messages(messages)
        return self.hf.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )


def validate_messages(messages: list[dict[str, Any]]) -> None:
    """Names the message index and field of the first problem."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}]: expected an object, got {type(message).__name__}")
        role = message.get("role")
        if role not in _ROLES:
            raise ValueError(f"messages[{i}].role: expected one of {', '.join(_ROLES)}, got {role!r}")
        content = message.get("content")
        if content is None and not (role == "assistant" and message.get("tool_calls")):
            raise ValueError(f"messages[{i}].content: missing")
        if content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content: expected a string, got {type(content).__name__}")


def load_tokenizer(path: str | Path) -> ChatTokenizer:
    path = Path(path)
    hf = AutoTokenizer.from_pretrained(str(path))
    eos: list[int] = []
    generation_config = path / "generation_config.json"
    if generation_config.exists():
        value = json.loads(generation_config.read_text()).get("eos_token_id")
        eos.extend(value if isinstance(value, list) else [] if value is None else [value])
    if hf.eos_token_id is not None and hf.eos_token_id not in eos:
        eos.append(hf.eos_token_id)
    return ChatTokenizer(hf, tuple(eos))
