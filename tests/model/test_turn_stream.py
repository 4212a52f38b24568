"""Streaming a turn: the deltas of reasoning and content add up to the non-streamed reply,
for every format, with and without tools, whatever the chunking."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.model.tool_formats import FORMATS
from venusrl.model.turn_stream import TurnStream, final_turn, prompt_opens_reasoning

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}}}}]
CALLS = {
    "hermes": '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
    "llama3_json": '{"name": "f", "parameters": {"x": 1}}',
}
PIECES = ["<think>", "</think>", "\n", "\n\n", " ", "a", "bc", "<", "{", "<tool_call>", "</tool_call>",
          "<|python_tag|>", "😀", '{"name": "f"', *CALLS.values()]


@settings(max_examples=400, deadline=None)
@given(fmt=st.sampled_from(sorted(FORMATS)), pieces=st.lists(st.sampled_from(PIECES), max_size=12),
       cuts=st.lists(st.integers(0, 400), max_size=12), with_tools=st.booleans(), opened=st.booleans())
def test_streamed_deltas_add_up_to_the_final_reply(fmt, pieces, cuts, with_tools, opened):
    text = "".join(pieces)
    tools = TOOLS if with_tools else None
    stream = TurnStream(tools, FORMATS[fmt], opened)
    reasoning, content = "", ""
    for cut in sorted(c for c in cuts if c <= len(text)):
        r, c = stream.update(text[:cut])
        reasoning, content = reasoning + r, content + c
    turn, r, c = stream.finish(text, "id")
    assert reasoning + r == (turn.reasoning_content or "")
    assert content + c == turn.content
    assert turn == final_turn(text, tools, FORMATS[fmt], opened, "id")


def test_reasoning_and_calls_of_a_qwen3_turn():
    text = "<think>\nmaybe " + CALLS["hermes"] + "\n</think>\n\nHere: " + CALLS["hermes"]
    stream = TurnStream(TOOLS, FORMATS["hermes"])
    deltas = [stream.update(text[:n]) for n in range(len(text) + 1)]
    turn, *_ = stream.finish(text, "id")
    assert turn.reasoning_content == "maybe " + CALLS["hermes"] and turn.content == "Here:"
    assert [json.loads(c["function"]["arguments"]) for c in turn.tool_calls] == [{"x": 1}]
    assert "".join(c for _, c in deltas) == "Here:"  # nothing of the call streamed as content


def test_prompt_opening_the_think_block():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    turn = final_turn("still thinking</think>\n\nanswer", None, FORMATS["hermes"], True, "id")
    assert (turn.reasoning_content, turn.content) == ("still thinking", "answer")
    stray = final_turn("an answer with </think> in it", None, FORMATS["hermes"], False, "id")
    assert stray.reasoning_content is None and stray.content == "an answer with </think> in it"
