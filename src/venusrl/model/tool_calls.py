"""Parse Qwen/Hermes tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`)
out of a model's turn into OpenAI-style tool_call objects.

Never raises on model output: every malformed call becomes a `ToolCallError` that the agent
loop hands back to the model as an observation, so a bad call costs a turn, not a trajectory.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(slots=True, frozen=True)
class ToolCallError:
    index: int  # position of the call in the turn, from 0
    message: str
    raw: str


@dataclass(slots=True)
class ParsedTurn:
    content: str  # the turn's text with well-formed tool-call blocks removed
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)


def tool_schemas_by_name(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    """OpenAI tools (`{"type": "function", "function": {...}}`) or bare function schemas."""
    if tools is None:
        return None
    schemas = {}
    for tool in tools:
        function = tool.get("function", tool)
        schemas[function["name"]] = function.get("parameters") or {}
    return schemas


def parse_tool_calls(text: str, tools: list[dict[str, Any]] | None = None, id_prefix: str = "call") -> ParsedTurn:
    """With `tools` given, names and arguments are checked against their schemas."""
    schemas = tool_schemas_by_name(tools)
    turn = ParsedTurn(content="")
    kept: list[str] = []
    position = 0
    for index, match in enumerate(_BLOCK.finditer(text)):
        before = text[position : match.start()]
        position = match.end()
        call, error = _parse_call(match.group(1), index, schemas, id_prefix)
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


def _parse_call(
    body: str, index: int, schemas: dict[str, dict[str, Any]] | None, id_prefix: str
) -> tuple[dict[str, Any] | None, ToolCallError | None]:
    def error(message: str) -> tuple[None, ToolCallError]:
        return None, ToolCallError(index, f"tool call {index}: {message}", body)

    try:
        payload = json.loads(body)
    except json.JSONDecodeError as err:
        return error(f"invalid JSON ({err.msg} at line {err.lineno} column {err.colno})")
    if not isinstance(payload, dict):
        return error(f'expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(payload).__name__}')
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return error('missing "name" (a non-empty string)')
    arguments = payload.get("arguments", payload.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            return error(f'"arguments" of {name!r} is a string that is not valid JSON ({err.msg})')
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return error(f'"arguments" of {name!r} must be a JSON object, got {type(arguments).__name__}')
    if schemas is not None:
        if name not in schemas:
            return error(f"unknown tool {name!r} (available: {', '.join(sorted(schemas)) or 'none'})")
        problem = _check_arguments(arguments, schemas[name])
        if problem:
            return error(f"{name!r}: {problem}")
    call = {
        "id": f"{id_prefix}_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
    return call, None


def _check_arguments(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """The checks a model most often fails: required arguments and top-level JSON types."""
    missing = [key for key in schema.get("required", []) if key not in arguments]
    if missing:
        return "missing required argument(s) " + ", ".join(repr(k) for k in missing)
    properties = schema.get("properties", {})
    for key, value in arguments.items():
        expected = properties.get(key, {}).get("type")
        if expected is None:
            continue
        allowed = expected if isinstance(expected, list) else [expected]
        python_types = tuple(t for name in allowed for t in _JSON_TYPES.get(name, (object,)))
        is_bool_as_number = isinstance(value, bool) and "boolean" not in allowed
        if not isinstance(value, python_types) or is_bool_as_number:
            return f"argument {key!r} must be {' or '.join(allowed)}, got {type(value).__name__}"
    return None
