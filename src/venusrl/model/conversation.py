"""Incremental multi-turn tokenization (token in, token out).

A conversation's token ids only ever grow at the end: the model's generated ids are kept
exactly as sampled, and every later message is rendered by the checkpoint's own chat
template, tokenized alone and appended. Re-tokenizing the whole rendered text instead could
merge tokens across a turn boundary or normalise the model's own text, which would break
both prefix-cache reuse and the training mask.

The delta for new messages is what the template writes after an assistant turn's content:
render `user, assistant(MARK), *new` with the generation prompt and take the text after MARK
(the end-of-turn text, the new messages, the next generation prompt with whatever the template
kwargs add to it, e.g. Qwen3's empty think block when `enable_thinking` is false). Only the
assistant turn just before the new messages is a reference, so templates that re-render
earlier turns (Qwen3 drops an assistant's empty `<think></think>` once a tool result follows)
still give the delta the full conversation's rendering has.

How training tokens relate to the template's rendering: they are exactly what the model saw
at each turn. While a conversation is a user query followed by tool calls and results, that
equals the template's rendering of the whole conversation. Qwen3's template also strips the
`<think>` blocks of the turns before the last user message when a new user message follows;
a trajectory keeps them (its context is append-only: the model's next turn is conditioned on
its earlier reasoning, as it was when sampled, and the cached prefix stays valid). So after a
follow-up user turn the ids are the template's rendering with those earlier think blocks put
back (tests/model/test_real_templates.py pins this).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from venusrl.model.chat import ChatTokenizer
from venusrl.model.tool_calls import ParsedTurn
from venusrl.model.turn_stream import prompt_opens_reasoning

_MARK = "\x00venusrl-mark\x00"
_USER = {"role": "user", "content": "u"}
_PROMPT_TAIL = 8  # ids at the end of a prompt enough to see whether it opens a think block


class TemplateLayoutError(ValueError):
    """The chat template does not render an assistant turn's content as written."""


def _after_mark(
    tokenizer: ChatTokenizer, tools: list[dict[str, Any]] | None, new_messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any] | None,
) -> str:
    reference = [_USER, {"role": "assistant", "content": _MARK}]
    text = tokenizer.render(reference + new_messages, tools, add_generation_prompt=bool(new_messages),
                            template_kwargs=template_kwargs)
    if text.count(_MARK) != 1:
        raise TemplateLayoutError("the chat template does not render an assistant message's content as written")
    return text[text.index(_MARK) + len(_MARK) :]


def assistant_end_text(
    tokenizer: ChatTokenizer, tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any] | None = None
) -> str:
    """What the template puts after an assistant message's content, e.g. '<|im_end|>\\n'."""
    return _after_mark(tokenizer, tools, [], template_kwargs)


def template_delta(
    tokenizer: ChatTokenizer, tools: list[dict[str, Any]] | None, new_messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """Text the template adds after an assistant turn's content: the end of that turn, then
    `new_messages`, then the generation prompt."""
    return _after_mark(tokenizer, tools, new_messages, template_kwargs)


@dataclass(slots=True)
class Conversation:
    """Token ids of a conversation and which of them the model generated (mask 1)."""

    tokenizer: ChatTokenizer
    tools: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any] | None = None  # on top of the tokenizer's configured ones
    token_ids: list[int] = field(default_factory=list)
    generated_mask: list[int] = field(default_factory=list)
    awaiting_messages: bool = False  # True between an assistant turn and the next messages
    _eos_text: str = ""  # the end-of-turn token the model sampled, which the delta then omits

    @classmethod
    def start(
        cls, tokenizer: ChatTokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> Conversation:
        conversation = cls(tokenizer, tools, [dict(m) for m in messages], template_kwargs)
        conversation._append(tokenizer.encode_chat(conversation.messages, tools, template_kwargs), generated=False)
        return conversation

    def add_assistant_turn(self, generated_ids: list[int], id_prefix: str = "call") -> ParsedTurn:
        """Append the model's ids as sampled and record the turn as an assistant message
        (its reasoning as `reasoning_content`, its calls as `tool_calls`)."""
        if self.awaiting_messages:
            raise ValueError("add_assistant_turn called twice without add_messages in between")
        opened = prompt_opens_reasoning(self.tokenizer.decode(self.token_ids[-_PROMPT_TAIL:]))
        self._append(generated_ids, generated=True)
        ends_with_eos = bool(generated_ids) and generated_ids[-1] in self.tokenizer.eos_token_ids
        body = generated_ids[:-1] if ends_with_eos else generated_ids
        self._eos_text = self.tokenizer.decode(generated_ids[-1:]) if ends_with_eos else ""
        self.awaiting_messages = True
        parsed = self.tokenizer.parse_turn(self.tokenizer.decode(body), self.tools, id_prefix, opened)
        self.messages.append(assistant_message(parsed))
        return parsed

    def add_messages(self, new_messages: list[dict[str, Any]]) -> list[int]:
        """Append tool results or user messages and the next generation prompt; returns the
        ids added."""
        if not self.awaiting_messages:
            raise ValueError("add_messages must follow an assistant turn")
        # names the index of a bad message within the whole conversation
        self.tokenizer.render(self.messages + new_messages, self.tools, template_kwargs=self.template_kwargs)
        delta = template_delta(self.tokenizer, self.tools, new_messages, self.template_kwargs)
        if self._eos_text and delta.startswith(self._eos_text):
            delta = delta[len(self._eos_text) :]
        added = self.tokenizer.encode(delta)
        self.messages.extend(dict(m) for m in new_messages)
        self.awaiting_messages = False
        self._eos_text = ""
        self._append(added, generated=False)
        return added

    def _append(self, ids: list[int], generated: bool) -> None:
        self.token_ids.extend(ids)
        self.generated_mask.extend([int(generated)] * len(ids))


def assistant_message(parsed: ParsedTurn) -> dict[str, Any]:
    """The trajectory's message of a parsed turn (content "" where the turn has only calls)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    return message
