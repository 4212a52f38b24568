"""Formats whose calls are `<tool_call>...</tool_call>` blocks in the answer's text: Hermes
(Qwen2.5, Qwen3: a JSON object inside) and Qwen3-Coder (XML-like function and parameter
tags inside). Text around well-formed blocks is the content; a malformed block stays in the
content and becomes an error."""

from __future__ import annotations

import json
import re
from typing import Any

from venusrl.model.tool_formats.base import (
    ParsedTurn,
    Schemas,
    ToolCallError,
    build_call,
    parameter_type,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class _TaggedFormat:
    start_marker = OPEN

    def parse(self, text: str, schemas: Schemas, id_prefix: str) -> ParsedTurn:
        turn = ParsedTurn(content="")
        kept: list[str] = []
        position = 0
        for index, match in enumerate(_BLOCK.finditer(text)):
            before = text[position : match.start()]
            position = match.end()
            call, error = self.parse_block(match.group(1), index, schemas, id_prefix)
            if error is None:
                kept.append(before)
                turn.tool_calls.append(call)
            else:
                kept.append(before + match.group(0))
                turn.errors.append(error)
        rest = text[position:]
        if OPEN in rest:
            index = len(turn.tool_calls) + len(turn.errors)
            raw = rest[rest.index(OPEN) :]
            turn.errors.append(ToolCallError(index, f"tool call {index}: {OPEN} is never closed by {CLOSE}", raw))
        kept.append(rest)
        turn.content = "".join(kept).strip()
        return turn

    def parse_block(self, body: str, index: int, schemas: Schemas, id_prefix: str):
        raise NotImplementedError


class HermesFormat(_TaggedFormat):
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`"""

    name = "hermes"

    def parse_block(self, body: str, index: int, schemas: Schemas, id_prefix: str):
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as err:
            message = f"tool call {index}: invalid JSON ({err.msg} at line {err.lineno} column {err.colno})"
            return None, ToolCallError(index, message, body)
        if not isinstance(payload, dict):
            message = f'tool call {index}: expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(payload).__name__}'
            return None, ToolCallError(index, message, body)
        arguments = payload.get("arguments", payload.get("parameters"))
        return build_call(payload.get("name"), arguments, index, schemas, id_prefix, body)


class Qwen3CoderFormat(_TaggedFormat):
    """`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`.
    A value is text; it is read as JSON where the tool's schema declares a non-string type
    (or declares none and the text is valid JSON), as Qwen3-Coder's own parser does."""

    name = "qwen3_coder"

    def parse_block(self, body: str, index: int, schemas: Schemas, id_prefix: str):
        function = _FUNCTION.match(body)
        if function is None:
            message = f"tool call {index}: expected <function=NAME>...</function> inside {OPEN}"
            return None, ToolCallError(index, message, body)
        name = function.group(1).strip()
        arguments: dict[str, Any] = {}
        for parameter in _PARAMETER.finditer(function.group(2)):
            key, raw = parameter.group(1).strip(), parameter.group(2).removeprefix("\n").removesuffix("\n")
            arguments[key] = _parameter_value(raw, parameter_type(schemas, name, key))
        leftover = _PARAMETER.sub("", function.group(2)).strip()
        if leftover:
            message = f"tool call {index}: text outside <parameter=...> tags in {name!r}: {leftover[:40]!r}"
            return None, ToolCallError(index, message, body)
        return build_call(name, arguments, index, schemas, id_prefix, body)


def _parameter_value(raw: str, types: list[str]) -> Any:
    if "string" in types:
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw  # a schema type check then names the mismatch
