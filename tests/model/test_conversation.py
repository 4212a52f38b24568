"""Incremental tokenization: ids only grow at the end, and the mask marks exactly what the
model generated."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.model.conversation import Conversation

TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}},
]
words = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00<>"), min_size=1, max_size=40).filter(
    lambda s: s == s.strip()  # the parser strips content; the property compares renders
)
calls = st.one_of(
    st.builds(lambda a, b: ("add", {"a": a, "b": b}), st.integers(-999, 999), st.integers(-999, 999)),
    st.builds(lambda t: ("note", {"text": t}), words),
)
assistant_turns = st.tuples(st.one_of(st.just(""), words), st.lists(calls, max_size=3))


def render_generation(content, tool_calls):
    """What a well-behaved model generates for a turn, in the template's own layout."""
    parts = [content] if content else []
    parts += [f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a, ensure_ascii=False)}}}\n</tool_call>'
              for n, a in tool_calls]
    return "\n".join(parts)


def eos(tokenizer):
    return tokenizer.hf.convert_tokens_to_ids("<|im_end|>")


@settings(max_examples=25, deadline=None)
@given(system=words, user=words, turns=st.lists(st.tuples(assistant_turns, st.lists(words, max_size=3)), min_size=1, max_size=8))
def test_long_conversations_grow_only_at_the_end(tiny_tokenizer, system, user, turns):
    tok = tiny_tokenizer
    conversation = Conversation.start(tok, [{"role": "system", "content": system}, {"role": "user", "content": user}], TOOLS)
    generated_texts = []
    for (content, tool_calls), observations in turns:
        before = list(conversation.token_ids)
        text = render_generation(content, tool_calls)
        generated_texts.append(text)
        parsed = conversation.add_assistant_turn(tok.encode(text) + [eos(tok)])
        assert parsed.errors == []
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == tool_calls
        assert conversation.token_ids[: len(before)] == before
        before = list(conversation.token_ids)
        if tool_calls:
            new = [{"role": "tool", "tool_call_id": c["id"], "content": o} for c, o in zip(parsed.tool_calls, observations + ["ok"] * 3, strict=False)]
        else:
            new = [{"role": "user", "content": observations[0] if observations else "go on"}]
        conversation.add_messages(new)
        assert conversation.token_ids[: len(before)] == before
        # the ids decode to exactly what the template renders for the whole history
        assert tok.decode(conversation.token_ids) == tok.render(conversation.messages, TOOLS, add_generation_prompt=True)
    assert len(conversation.generated_mask) == len(conversation.token_ids)
    generated = [t for t, m in zip(conversation.token_ids, conversation.generated_mask, strict=True) if m]
    assert tok.decode(generated) == "<|im_end|>".join(generated_texts) + "<|im_end|>"


def test_truncated_turn_is_closed_by_template_text_not_by_generated_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    conversation = Conversation.start(tok, [{"role": "user", "content": "hi"}])
    generated = tok.encode("I was cut off mid-sent")
    conversation.add_assistant_turn(generated)
    added = conversation.add_messages([{"role": "user", "content": "continue"}])
    assert tok.decode(added).startswith("<|im_end|>\n<|im_start|>user\ncontinue")
    assert sum(conversation.generated_mask) == len(generated)


def test_malformed_tool_call_keeps_ids_and_reports_error(tiny_tokenizer):
    tok = tiny_tokenizer
    conversation = Conversation.start(tok, [{"role": "user", "content": "add"}], TOOLS)
    generated = tok.encode('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>') + [eos(tok)]
    parsed = conversation.add_assistant_turn(generated)
    assert parsed.tool_calls == [] and "missing required argument(s) 'b'" in parsed.errors[0].message
    start = len(conversation.token_ids)
    conversation.add_messages([{"role": "user", "content": parsed.errors[0].message}])
    assert conversation.token_ids[start - len(generated) : start] == generated


def test_calls_out_of_order_are_errors(tiny_tokenizer):
    conversation = Conversation.start(tiny_tokenizer, [{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="must follow an assistant turn"):
        conversation.add_messages([{"role": "user", "content": "again"}])
    conversation.add_assistant_turn([eos(tiny_tokenizer)])
    with pytest.raises(ValueError, match="called twice"):
        conversation.add_assistant_turn([eos(tiny_tokenizer)])


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "non-empty list"),
        ([{"role": "robot", "content": "x"}], r"messages\[0\].role: expected one of"),
        ([{"role": "user"}], r"messages\[0\].content: missing"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": 5}], r"messages\[1\].content: expected a string"),
    ],
)
def test_bad_messages_name_the_index(tiny_tokenizer, messages, message):
    with pytest.raises(ValueError, match=message):
        Conversation.start(tiny_tokenizer, messages)
