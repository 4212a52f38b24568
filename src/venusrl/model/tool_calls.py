"""A model's turn -> reasoning, content and OpenAI-style tool calls.

The reasoning (`<think>...</think>`, as Qwen3 writes it; the opening tag may be in the
prompt instead) is split off first and never parsed: a call drafted or quoted while thinking is not
executed. The rest is parsed by the tool-call format (tool_formats/): Hermes, Qwen3-Coder XML
or Llama 3 JSON.
"""

from __future__ import annotations

from typing import Any

from venusrl.model.tool_formats import get_format
from venusrl.model.tool_formats.base import (
    ParsedTurn,
    ToolCallError,
    ToolCallFormat,
    ToolSchemaError,
    tool_schemas_by_name,
)
from venusrl.model.tool_formats.tagged import OPEN

__all__ = ["OPEN", "ParsedTurn", "ToolCallError", "ToolSchemaError", "parse_tool_calls", "split_reasoning",
           "tool_schemas_by_name"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str, opened: bool = False) -> tuple[str | None, str]:
    """(reasoning, answer). A turn reasons when it opens with `<think>`, or when its prompt
    already opened the block (`opened`); a turn cut off while thinking is all reasoning."""
    body = text.lstrip()
    if not opened and not body.startswith(THINK_OPEN):
        return None, text
    body = body.removeprefix(THINK_OPEN)
    reasoning, closed, answer = body.partition(THINK_CLOSE)
    return reasoning.strip("\n"), answer if closed else ""


def parse_tool_calls(
    text: str, tools: list[dict[str, Any]] | None = None, id_prefix: str = "call",
    format: str | ToolCallFormat = "hermes", opened: bool = False,
) -> ParsedTurn:
    """With `tools` given, names and arguments are checked against their schemas."""
    tool_format = get_format(format) if isinstance(format, str) else format
    reasoning, answer = split_reasoning(text, opened)
    turn = tool_format.parse(answer, tool_schemas_by_name(tools), id_prefix)
    turn.reasoning_content = reasoning
    return turn
