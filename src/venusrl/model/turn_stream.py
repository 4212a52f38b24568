"""A chat turn as a client sees it -- reasoning_content, content, tool_calls -- both at
once (the final text) and as it streams, with one invariant: what has been streamed of each
field is always a prefix of that field in the final parse, so the streamed deltas add up to
the non-streamed reply exactly.

While streaming, text is held back wherever the final parse could still change it: a
possible `<think>`/`</think>` tag, trailing newlines of the reasoning and surrounding
whitespace of the content (both stripped at the end), and everything from where a tool call
may start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from venusrl.model.tool_calls import (
    THINK_CLOSE,
    THINK_OPEN,
    ParsedTurn,
    parse_tool_calls,
    split_reasoning,
)
from venusrl.model.tool_formats import ToolCallFormat
from venusrl.model.tool_formats.llama3_json import PYTHON_TAG


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """Whether the generation prompt already opened the think block (e.g. Qwen3 thinking-only
    templates end it with '<think>\\n'): the turn then starts in its reasoning."""
    return prompt_text.rstrip().endswith(THINK_OPEN)


def final_turn(text: str, tools: list[dict[str, Any]] | None, tool_format: ToolCallFormat, opened: bool,
               id_prefix: str) -> ParsedTurn:
    """The reply to a finished turn: tool calls are parsed only when the request has tools;
    the content is stripped of surrounding whitespace either way."""
    if tools:
        return parse_tool_calls(text, tools, id_prefix, tool_format, opened)
    reasoning, answer = split_reasoning(text, opened)
    return ParsedTurn(content=answer.strip(), reasoning_content=reasoning)


@dataclass(slots=True)
class TurnStream:
    """Deltas of a turn's reasoning and content as its text grows."""

    tools: list[dict[str, Any]] | None
    tool_format: ToolCallFormat
    opened: bool = False
    sent_reasoning: str = ""
    sent_content: str = ""

    def update(self, text: str) -> tuple[str, str]:
        """(reasoning delta, content delta) safe to send for the text so far."""
        return self._advance(*self._streamable(text))

    def finish(self, text: str, id_prefix: str) -> tuple[ParsedTurn, str, str]:
        """The final parse and the deltas still owed to match it."""
        turn = final_turn(text, self.tools, self.tool_format, self.opened, id_prefix)
        return turn, *self._advance(turn.reasoning_content or "", turn.content)

    def _advance(self, reasoning: str, content: str) -> tuple[str, str]:
        reasoning_delta = _extension(self.sent_reasoning, reasoning)
        content_delta = _extension(self.sent_content, content)
        self.sent_reasoning += reasoning_delta
        self.sent_content += content_delta
        return reasoning_delta, content_delta

    def _streamable(self, text: str) -> tuple[str, str]:
        body = text.lstrip()
        if THINK_OPEN.startswith(body) and body != THINK_OPEN:
            return "", ""  # may still become '<think>'
        if not self.opened and not body.startswith(THINK_OPEN):
            return "", self._streamable_answer(text)
        reasoning, closed, answer = body.removeprefix(THINK_OPEN).partition(THINK_CLOSE)
        if not closed:
            return _without_tag_start(reasoning, THINK_CLOSE).strip("\n"), ""
        return reasoning.strip("\n"), self._streamable_answer(answer)

    def _streamable_answer(self, answer: str) -> str:
        if self.tools:
            marker = self.tool_format.start_marker
            if marker == "{":  # Llama 3 JSON: a call is the whole answer, so an answer opening like one waits
                head = answer.lstrip()
                if head.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(head):
                    return ""
            elif marker in answer:
                answer = answer[: answer.index(marker)]
            else:
                answer = _without_tag_start(answer, marker)
        return answer.strip()


def _extension(sent: str, value: str) -> str:
    """What `value` adds to what was sent (nothing if it does not extend it)."""
    return value[len(sent) :] if value.startswith(sent) else ""


def _without_tag_start(text: str, tag: str) -> str:
    """`text` without a tail that could be the start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return text[:-size]
    return text
