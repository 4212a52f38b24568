"""Tool-call parsing: good calls become OpenAI objects, bad ones structured errors."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.model.tool_calls import parse_tool_calls

TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
]


def call(name, arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_several_calls_in_one_turn():
    text = "First add, then list.\n" + call("add", {"a": 1, "b": 2.5}) + "\n" + call("bash", {"cmd": "ls"})
    turn = parse_tool_calls(text, TOOLS, id_prefix="t7")
    assert turn.errors == []
    assert turn.content == "First add, then list."
    assert [c["function"]["name"] for c in turn.tool_calls] == ["add", "bash"]
    assert [c["id"] for c in turn.tool_calls] == ["t7_0", "t7_1"]
    assert json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"a": 1, "b": 2.5}
    assert turn.tool_calls[0]["type"] == "function"


def test_no_tools_declared_accepts_any_name():
    turn = parse_tool_calls(call("anything", {"x": [1]}))
    assert turn.errors == [] and turn.tool_calls[0]["function"]["name"] == "anything"


def test_arguments_given_as_json_string():
    text = '<tool_call>{"name": "bash", "arguments": "{\\"cmd\\": \\"pwd\\"}"}</tool_call>'
    turn = parse_tool_calls(text, TOOLS)
    assert turn.errors == [] and json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"cmd": "pwd"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"name": "add", "arguments": {"a": 1, "b": 2}', "invalid JSON"),
        ('["add", 1]', "expected a JSON object"),
        ('{"arguments": {"a": 1}}', 'missing "name"'),
        ('{"name": "mul", "arguments": {}}', "unknown tool 'mul' \\(available: add, bash\\)"),
        ('{"name": "add", "arguments": {"a": 1}}', "missing required argument\\(s\\) 'b'"),
        ('{"name": "add", "arguments": {"a": "one", "b": 2}}', "argument 'a' must be number, got str"),
        ('{"name": "add", "arguments": {"a": true, "b": 2}}', "argument 'a' must be number, got bool"),
        ('{"name": "add", "arguments": [1, 2]}', '"arguments" of \'add\' must be a JSON object'),
        ('{"name": "add", "arguments": "not json"}', "is a string that is not valid JSON"),
    ],
)
def test_malformed_calls_are_structured_errors(body, message):
    text = f"thinking <tool_call>{body}</tool_call> and " + call("bash", {"cmd": "ls"})
    turn = parse_tool_calls(text, TOOLS)
    assert len(turn.errors) == 1
    assert turn.errors[0].index == 0
    assert turn.errors[0].message.startswith("tool call 0: ")
    assert pytest.importorskip("re").search(message, turn.errors[0].message)
    assert [c["function"]["name"] for c in turn.tool_calls] == ["bash"]
    assert body in turn.content, "a malformed call stays visible in the content"


def test_unclosed_call_is_an_error():
    turn = parse_tool_calls(call("bash", {"cmd": "ls"}) + '\n<tool_call>\n{"name": "add", "argu', TOOLS)
    assert len(turn.tool_calls) == 1
    assert turn.errors[0].index == 1 and "never closed" in turn.errors[0].message


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=30), st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"name"', ":"])), max_size=30))
def test_parser_never_raises(pieces):
    turn = parse_tool_calls("".join(pieces), TOOLS)
    assert all(e.message.startswith("tool call ") for e in turn.errors)


def coder_call(name, **parameters):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in parameters.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_qwen3_coder_xml_calls_read_values_by_schema_type():
    text = "Adding.\n" + coder_call("add", a="1", b="2.5") + "\n" + coder_call("bash", cmd="echo 1\nls -l")
    turn = parse_tool_calls(text, TOOLS, id_prefix="c", format="qwen3_coder")
    assert turn.errors == [] and turn.content == "Adding."
    assert [json.loads(c["function"]["arguments"]) for c in turn.tool_calls] == [
        {"a": 1, "b": 2.5}, {"cmd": "echo 1\nls -l"}]


def test_qwen3_coder_malformed_calls_are_errors():
    turn = parse_tool_calls(coder_call("add", a="one", b="2"), TOOLS, format="qwen3_coder")
    assert turn.tool_calls == [] and "argument 'a' must be number" in turn.errors[0].message
    turn = parse_tool_calls('<tool_call>\n{"name": "add"}\n</tool_call>', TOOLS, format="qwen3_coder")
    assert "<function=NAME>" in turn.errors[0].message


def test_llama3_json_calls():
    one = parse_tool_calls('{"name": "bash", "parameters": {"cmd": "ls"}}', TOOLS, format="llama3_json")
    assert one.errors == [] and one.content == "" and json.loads(one.tool_calls[0]["function"]["arguments"]) == {"cmd": "ls"}
    two = parse_tool_calls('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; '
                           '{"name": "bash", "parameters": {"cmd": "pwd"}}', TOOLS, format="llama3_json")
    assert [c["function"]["name"] for c in two.tool_calls] == ["add", "bash"]
    answer = parse_tool_calls('The answer is {"x": 1}.', TOOLS, format="llama3_json")
    assert answer.tool_calls == [] and answer.errors == [] and answer.content == 'The answer is {"x": 1}.'
    broken = parse_tool_calls('{"name": "add", "parameters": {"a": 1', TOOLS, format="llama3_json")
    assert broken.tool_calls == [] and "invalid JSON" in broken.errors[0].message


def test_reasoning_is_split_off_before_parsing_in_every_format():
    for fmt, call in (("hermes", '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'),
                      ("qwen3_coder", coder_call("bash", cmd="ls")),
                      ("llama3_json", '{"name": "bash", "parameters": {"cmd": "ls"}}')):
        turn = parse_tool_calls(f"<think>\nfirst {call} no, wait\n</think>\n\n{call}", TOOLS, format=fmt)
        assert len(turn.tool_calls) == 1 and turn.errors == [], fmt
        assert turn.reasoning_content == f"first {call} no, wait"


def test_malformed_tool_schemas_name_the_field():
    from venusrl.model.tool_calls import ToolSchemaError

    for tools, where in (([{"type": "function"}], "tools[0].function"), ([{"type": "function", "function": {}}],
                         "tools[0].function.name"), (["x"], "tools[0]"), ([{"type": "retrieval"}], "tools[0].type")):
        with pytest.raises(ToolSchemaError, match=re.escape(where)):
            parse_tool_calls("hi", tools)
