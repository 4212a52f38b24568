"""What every tool-call format shares: the parsed turn, the structured error a malformed
call becomes, and the checks of a call against its tool's schema.

Never raises on model output: every malformed call becomes a `ToolCallError` that the agent
loop hands back to the model as an observation, so a bad call costs a turn, not a trajectory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

Schemas = dict[str, dict[str, Any]] | None  # tool name -> JSON schema of its parameters; None: any tool

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
    content: str  # the answer's text with well-formed tool calls removed (reasoning excluded)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)
    reasoning_content: str | None = None  # the text inside <think>...</think>; never parsed for calls


class ToolCallFormat(Protocol):
    name: str
    start_marker: str  # text that may begin a call: a stream holds content back from here

    def parse(self, text: str, schemas: Schemas, id_prefix: str) -> ParsedTurn:
        """Calls out of an answer's text (reasoning already split off)."""


class ToolSchemaError(ValueError):
    """A `tools` entry a client sent is malformed; the message names tools[i] and the field."""


def tool_schemas_by_name(tools: list[dict[str, Any]] | None) -> Schemas:
    """OpenAI tools (`{"type": "function", "function": {...}}`) or bare function schemas."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ToolSchemaError(f"tools: expected a list, got {type(tools).__name__}")
    schemas = {}
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ToolSchemaError(f"tools[{i}]: expected an object, got {type(tool).__name__}")
        if tool.get("type", "function") != "function":
            raise ToolSchemaError(f"tools[{i}].type: only 'function' tools are served, got {tool.get('type')!r}")
        function = tool.get("function", tool if "name" in tool else None)
        where = f"tools[{i}].function" if "type" in tool else f"tools[{i}]"
        if not isinstance(function, dict):
            raise ToolSchemaError(f"{where}: missing (an object with a name and parameters)")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolSchemaError(f"{where}.name: expected a non-empty string, got {name!r}")
        parameters = function.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ToolSchemaError(f"{where}.parameters: expected a JSON schema object, got {type(parameters).__name__}")
        if not isinstance(parameters.get("properties", {}), dict):
            raise ToolSchemaError(f"{where}.parameters.properties: expected an object")
        required = parameters.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ToolSchemaError(f"{where}.parameters.required: expected a list of parameter names")
        schemas[name] = parameters
    return schemas


def build_call(
    name: Any, arguments: Any, index: int, schemas: Schemas, id_prefix: str, raw: str
) -> tuple[dict[str, Any] | None, ToolCallError | None]:
    """An OpenAI tool_call object, or the error that names what is wrong with it."""

    def error(message: str) -> tuple[None, ToolCallError]:
        return None, ToolCallError(index, f"tool call {index}: {message}", raw)

    if not isinstance(name, str) or not name:
        return error('missing "name" (a non-empty string)')
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


def parameter_type(schemas: Schemas, tool: str, parameter: str) -> list[str]:
    """The JSON types a tool's parameter declares ([] when the schema does not say)."""
    declared = ((schemas or {}).get(tool) or {}).get("properties", {}).get(parameter, {})
    kind = declared.get("type") if isinstance(declared, dict) else None
    return [t for t in (kind if isinstance(kind, list) else [kind]) if isinstance(t, str)]


def _check_arguments(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """The checks a model most often fails: required arguments and top-level JSON types."""
    missing = [key for key in schema.get("required", []) if key not in arguments]
    if missing:
        return "missing required argument(s) " + ", ".join(repr(k) for k in missing)
    properties = schema.get("properties", {})
    for key, value in arguments.items():
        expected = properties.get(key, {}).get("type") if isinstance(properties.get(key), dict) else None
        allowed = [t for t in (expected if isinstance(expected, list) else [expected]) if isinstance(t, str)]
        if not allowed:
            continue
        python_types = tuple(t for name in allowed for t in _JSON_TYPES.get(name, (object,)))
        is_bool_as_number = isinstance(value, bool) and "boolean" not in allowed
        if not isinstance(value, python_types) or is_bool_as_number:
            return f"argument {key!r} must be {' or '.join(allowed)}, got {type(value).__name__}"
    return None
