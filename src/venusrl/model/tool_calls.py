"""A model's turn -> reasoning, content and OpenAI-style tool calls.

The reasoning (`<think>...</think>`, as Qwen3 writes it; the opening tag may be in the prompt
instead) is split off first and never parsed: a call drafted or quoted while thinking is not
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


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer). A turn cut off while thinking is all reasoning."""
    if THINK_CLOSE in text:
        reasoning, _, answer = text.partition(THINK_CLOSE)
        reasoning = reasoning.lstrip().removeprefix(THINK_OPEN)
        return reasoning.strip("\n"), answer
    if text.lstrip().startswith(THINK_OPEN):
        return text.lstrip().removeprefix(THINK_OPEN).strip("\n"), ""
    return None, text


def parse_tool_calls(
    text: str, tools: list[dict[str, Any]] | None = None, id_prefix: str = "call",
    format: str | ToolCallFormat = "hermes",
) -> ParsedTurn:
    """With `tools` given, names and arguments are checked against their schemas."""
    tool_format = get_format(format) if isinstance(format, str) else format
    reasoning, answer = split_reasoning(text)
    turn = tool_format.parse(answer, tool_schemas_by_name(tools), id_prefix)
    turn.reasoning_content = reasoning
    return turn
