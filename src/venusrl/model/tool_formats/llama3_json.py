"""Llama 3.1/3.2's JSON tool calls: the whole answer is `{"name": ..., "parameters": {...}}`
(optionally after `<|python_tag|>`, several calls separated by `;`). An answer that does not
open with a call is plain content; one that does and is not valid is an error."""

from __future__ import annotations

import json
import re

from venusrl.model.tool_formats.base import ParsedTurn, Schemas, ToolCallError, build_call

PYTHON_TAG = "<|python_tag|>"
_CALL_START = re.compile(r'^\{\s*"(name|function)"\s*:')


class Llama3JsonFormat:
    name = "llama3_json"
    start_marker = "{"

    def parse(self, text: str, schemas: Schemas, id_prefix: str) -> ParsedTurn:
        body = text.strip()
        tagged = body.startswith(PYTHON_TAG)
        body = body.removeprefix(PYTHON_TAG).strip()
        if not tagged and not _CALL_START.match(body):
            return ParsedTurn(content=body)
        turn = ParsedTurn(content="")
        decoder = json.JSONDecoder()
        position, index = 0, 0
        while position < len(body):
            try:
                payload, end = decoder.raw_decode(body, position)
            except json.JSONDecodeError as err:
                turn.errors.append(ToolCallError(index, f"tool call {index}: invalid JSON ({err.msg} at column {err.colno})",
                                                 body[position:]))
                break
            raw = body[position:end]
            if isinstance(payload, dict):
                arguments = payload.get("parameters", payload.get("arguments"))
                call, error = build_call(payload.get("name", payload.get("function")), arguments, index, schemas,
                                         id_prefix, raw)
            else:
                call, error = None, ToolCallError(index, f"tool call {index}: expected a JSON object", raw)
            if error is None:
                turn.tool_calls.append(call)
            else:
                turn.errors.append(error)
            index += 1
            position = end
            while position < len(body) and body[position] in " \t\n;":
                position += 1
        if turn.errors:
            turn.content = body
        return turn
