"""Tool-call formats by name, and which one a chat template speaks.

Add a format: a class with `name`, `start_marker` and `parse(text, schemas, id_prefix)`
(tool_formats/base.py), registered in FORMATS and, if a template shows it, in `detect_format`.
"""

from __future__ import annotations

from venusrl.model.tool_formats.base import ToolCallFormat
from venusrl.model.tool_formats.llama3_json import Llama3JsonFormat
from venusrl.model.tool_formats.tagged import HermesFormat, Qwen3CoderFormat

FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (HermesFormat(), Qwen3CoderFormat(), Llama3JsonFormat())}
FORMAT_NAMES = ("auto", *FORMATS)


def get_format(name: str) -> ToolCallFormat:
    if name not in FORMATS:
        raise ValueError(f"tool call format {name!r} is not one of {', '.join(FORMATS)}")
    return FORMATS[name]


def detect_format(chat_template: str) -> ToolCallFormat:
    """The format the template teaches: Qwen3-Coder's `<function=...>` inside `<tool_call>`,
    Hermes `<tool_call>` JSON (Qwen2.5, Qwen3), Llama 3's header tokens; Hermes otherwise."""
    if "<tool_call>" in chat_template and "<function=" in chat_template and "<parameter=" in chat_template:
        return FORMATS["qwen3_coder"]
    if "<tool_call>" in chat_template:
        return FORMATS["hermes"]
    if "<|start_header_id|>" in chat_template:
        return FORMATS["llama3_json"]
    return FORMATS["hermes"]
