"""Incremental multi-turn tokenization.

A conversation's token ids only ever grow at the end: the model's generated ids are kept
exactly as sampled, and every later message is rendered by the chat template as a delta
against a fixed reference history, tokenized alone and appended. Re-tokenizing the whole
rendered text instead could merge tokens across a turn boundary or normalise the model's own
text, which would break both prefix-cache reuse and the training mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from venusrl.model.chat import ChatTokenizer
from venusrl.model.tool_calls import ParsedTurn, parse_tool_calls

_MARK = "\x00venusrl-mark\x00"
_REFERENCE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]


class TemplateLayoutError(ValueError):
    """The chat template does not render a conversation as a prefix of its continuation."""


def assistant_end_text(tokenizer: ChatTokenizer, tools: list[dict[str, Any]] | None) -> str:
    """What the template puts after an assistant message's content, e.g. '<|im_end|>\\n'."""
    text = tokenizer.render([_REFERENCE[0], {"role": "assistant", "content": _MARK}], tools)
    return text[text.index(_MARK) + len(_MARK) :]


def template_delta(tokenizer: ChatTokenizer, tools: list[dict[str, Any]] | None, new_messages: list[dict[str, Any]]) -> str:
    """Text the template adds for `new_messages` after an assistant turn, generation prompt
    included."""
    before = tokenizer.render(_REFERENCE, tools)
    after = tokenizer.render(_REFERENCE + new_messages, tools, add_generation_prompt=True)
    if not after.startswith(before):
        raise TemplateLayoutError("the chat template re-renders earlier turns when messages are appended")
    return after[len(before) :]


@dataclass(slots=True)
class Conversation:
    """Token ids of a conversation and which of them the model generated (mask 1)."""

    tokenizer: ChatTokenizer
    tools: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]
    token_ids: list[int] = field(default_factory=list)
    generated_mask: list[int] = field(default_factory=list)
    awaiting_messages: bool = False  # True between an assistant turn and the next messages
    _turn_end: str = ""  # template text owed after the last assistant turn

    @classmethod
    def start(
        cls, tokenizer: ChatTokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> Conversation:
        conversation = cls(tokenizer, tools, [dict(m) for m in messages])
        conversation._append(tokenizer.encode_chat(conversation.messages, tools), generated=False)
        return conversation

    def add_assistant_turn(self, generated_ids: list[int], id_prefix: str = "call") -> ParsedTurn:
        """Append the model's ids as sampled and record the turn as an assistant message."""
        if self.awaiting_messages:
            raise ValueError("add_assistant_turn called twice without add_messages in between")
        self._append(generated_ids, generated=True)
        ends_with_eos = bool(generated_ids) and generated_ids[-1] in self.tokenizer.eos_token_ids
        body = generated_ids[:-1] if ends_with_eos else generated_ids
        turn_end = assistant_end_text(self.tokenizer, self.tools)
        if ends_with_eos:
            eos_text = self.tokenizer.decode(generated_ids[-1:])
            if turn_end.startswith(eos_text):
                turn_end = turn_end[len(eos_text) :]
        self._turn_end = turn_end
        self.awaiting_messages = True
        parsed = parse_tool_calls(self.tokenizer.decode(body), self.tools, id_prefix)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        self.messages.append(message)
        return parsed

    def add_messages(self, new_messages: list[dict[str, Any]]) -> list[int]:
        """Append tool results or user messages and the next generation prompt; returns the
        ids added."""
        if not self.awaiting_messages:
            raise ValueError("add_messages must follow an assistant turn")
        self.tokenizer.render(self.messages + new_messages)  # names the index of a bad message
        added = self.tokenizer.encode(self._turn_end + template_delta(self.tokenizer, self.tools, new_messages))
        self.messages.extend(dict(m) for m in new_messages)
        self.awaiting_messages = False
        self._turn_end = ""
        self._append(added, generated=False)
        return added

    def _append(self, ids: list[int], generated: bool) -> None:
        self.token_ids.extend(ids)
        self.generated_mask.extend([int(generated)] * len(ids))
