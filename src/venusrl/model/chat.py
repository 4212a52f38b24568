"""Tokenizer with its chat template, loaded from a Hugging Face directory."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from venusrl.model.tool_calls import ParsedTurn, parse_tool_calls
from venusrl.model.tool_formats import ToolCallFormat, detect_format, get_format
from venusrl.model.tool_formats.base import tool_schemas_by_name

_ROLES = ("system", "user", "assistant", "tool")


class TemplateRenderError(ValueError):
    """The chat template failed on a conversation; the message names the message index."""


class ChatTokenizer:
    """A Hugging Face tokenizer plus what the agent loop needs from it: rendering through
    the checkpoint's own chat template (with its keyword arguments, e.g. Qwen3's
    `enable_thinking`), the ids that end a turn, and the template's tool-call format."""

    def __init__(
        self,
        hf: PreTrainedTokenizerBase,
        eos_token_ids: tuple[int, ...],
        template_kwargs: dict[str, Any] | None = None,
        tool_call_format: str = "auto",
    ):
        if not hf.chat_template:
            raise ValueError(f"tokenizer {hf.name_or_path!r} has no chat template")
        self.hf = hf
        self.eos_token_ids = eos_token_ids
        self._added_tokens = frozenset(hf.get_added_vocab())
        self.configure(template_kwargs, tool_call_format)

    def configure(self, template_kwargs: dict[str, Any] | None, tool_call_format: str = "auto") -> None:
        """Set the template's keyword arguments (config `model.chat_template_kwargs`) and the
        tool-call format (`model.tool_call_format`; auto: detected from the template)."""
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        self.tool_format: ToolCallFormat = (
            detect_format(self.hf.chat_template) if tool_call_format == "auto" else get_format(tool_call_format))

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (a byte-level token may hold part of a UTF-8 character)."""
        token = self.hf.convert_ids_to_tokens(token_id)
        if token in self._added_tokens:
            return token.encode()
        if (byte := _BYTE_FALLBACK.fullmatch(token)) is not None:  # SentencePiece's <0xF0>
            return bytes([int(byte.group(1), 16)])
        try:
            return bytes(_BYTE_DECODER[c] for c in token)
        except KeyError:  # not a byte-level vocabulary: its text is its bytes
            return self.decode([token_id]).encode()

    def encode_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Prompt ids of a conversation, ending with the generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True, template_kwargs=template_kwargs))

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The template's text; `template_kwargs` add to (and override) the configured ones.
        Raises ValueError naming the message index (and field where it is known)."""
        messages = template_messages(messages)
        tool_schemas_by_name(tools)  # names tools[i] and the field of a malformed schema
        kwargs = {**self.template_kwargs, **(template_kwargs or {})}

        def apply(upto: int, generation_prompt: bool) -> str:
            return self.hf.apply_chat_template(messages[:upto], tools=tools, tokenize=False,
                                               add_generation_prompt=generation_prompt, **kwargs)

        try:
            return apply(len(messages), add_generation_prompt)
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as err:
            index = _first_failing_message(apply, len(messages))
            raise TemplateRenderError(f"messages[{index}]: the chat template cannot render it "
                                      f"({type(err).__name__}: {err})") from None

    def parse_turn(
        self, text: str, tools: list[dict[str, Any]] | None, id_prefix: str = "call", opened: bool = False
    ) -> ParsedTurn:
        """`opened`: the generation prompt already opened the think block."""
        return parse_tool_calls(text, tools, id_prefix, self.tool_format, opened)


def _first_failing_message(apply, count: int) -> int:
    """The culprit ends the shortest prefix the template fails on (found by bisection: a
    template failing on a message fails on every longer prefix); the last message if every
    proper prefix renders, e.g. a template that rejects how the conversation ends."""
    low, high = 1, count  # the prefix of `high` messages fails
    while low < high:
        middle = (low + high) // 2
        try:
            apply(middle, False)
        except Exception:  # any failure of the template marks the culprit
            high = middle
        else:
            low = middle + 1
    return high - 1


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them, checked; errors name the index and field.
    OpenAI shapes the templates do not take are normalised: `content: None` (beside
    tool_calls) becomes "", content parts become their text, tool-call arguments given as a
    JSON string become an object (templates serialise them with `tojson`)."""
    validate_messages(messages)
    out = []
    for i, message in enumerate(messages):
        message = dict(message)
        content = message.get("content")
        if content is None:
            message["content"] = ""
        elif isinstance(content, list):
            message["content"] = "".join(part["text"] for part in content)
        if message.get("tool_calls"):
            message["tool_calls"] = [_template_call(i, j, call) for j, call in enumerate(message["tool_calls"])]
        out.append(message)
    return out


def _template_call(i: int, j: int, call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise ValueError(f"messages[{i}].tool_calls[{j}].function.arguments: not valid JSON ({err.msg})") from None
    return {**call, "function": function}


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
        tool_calls = message.get("tool_calls")
        if content is None and not (role == "assistant" and tool_calls):
            raise ValueError(f"messages[{i}].content: missing")
        if isinstance(content, list):
            for k, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise ValueError(f"messages[{i}].content[{k}]: only text parts are served "
                                     '({"type": "text", "text": "..."})')
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content: expected a string, got {type(content).__name__}")
        for key in ("reasoning_content", "name", "tool_call_id"):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise ValueError(f"messages[{i}].{key}: expected a string, got {type(message[key]).__name__}")
        if tool_calls is not None:
            _validate_tool_calls(i, role, tool_calls)


def _validate_tool_calls(i: int, role: Any, tool_calls: Any) -> None:
    if role != "assistant":
        raise ValueError(f"messages[{i}].tool_calls: only an assistant message has tool calls")
    if not isinstance(tool_calls, list):
        raise ValueError(f"messages[{i}].tool_calls: expected a list, got {type(tool_calls).__name__}")
    for j, call in enumerate(tool_calls):
        where = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise ValueError(f"{where}.function: expected an object with name and arguments")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise ValueError(f"{where}.function.name: expected a non-empty string")
        if not isinstance(function.get("arguments", {}), str | dict):
            raise ValueError(f"{where}.function.arguments: expected a JSON string or an object")


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level alphabet: the printable character each byte is written as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, shifted = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + shifted)
            shifted += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


_BYTE_DECODER = _byte_decoder()
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def load_tokenizer(
    path: str | Path, template_kwargs: dict[str, Any] | None = None, tool_call_format: str = "auto"
) -> ChatTokenizer:
    path = Path(path)
    hf = AutoTokenizer.from_pretrained(str(path))
    eos: list[int] = []
    generation_config = path / "generation_config.json"
    if generation_config.exists():
        value = json.loads(generation_config.read_text()).get("eos_token_id")
        eos.extend(value if isinstance(value, list) else [] if value is None else [value])
    if hf.eos_token_id is not None and hf.eos_token_id not in eos:
        eos.append(hf.eos_token_id)
    return ChatTokenizer(hf, tuple(eos), template_kwargs, tool_call_format)
