"""The OpenAI surface on the official Qwen3 template, driven by the real openai client
against `venusrl serve` on a small model of the real Qwen3 vocabulary that thinks, then calls
a tool (tests/engine/tool_model.py)."""

import json

import httpx
import openai
import pytest
from tests.engine.serving import API_KEY, AUTH, serving
from tests.engine.tool_model import ADD_TOOL, SPLIT_EMOJI, THINKING_REPLY, TOOL_PROMPT


@pytest.fixture(scope="module")
def server(qwen3_tool_model_dir):
    with serving(qwen3_tool_model_dir, model_name="qwen3-tiny") as running:
        yield running


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key=API_KEY)


def ask(client, **kwargs):
    return client.chat.completions.create(model="qwen3-tiny", messages=TOOL_PROMPT, tools=[ADD_TOOL],
                                          **{"max_tokens": 64, "temperature": 0, **kwargs})


def test_thinking_goes_to_reasoning_content_and_the_call_to_tool_calls(client):
    choice = ask(client).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == f"Add them {SPLIT_EMOJI}."
    (call,) = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}


def test_logprob_bytes_are_each_tokens_own_bytes(client):
    entries = ask(client, logprobs=True).choices[0].logprobs.content
    assert b"".join(bytes(e.bytes) for e in entries) == (THINKING_REPLY + "<|im_end|>").encode()
    partial = []
    for entry in entries:
        try:
            bytes(entry.bytes).decode()
        except UnicodeDecodeError:
            partial.append(entry)
    assert len(partial) == 3  # the emoji spans three tokens, none a whole character
    assert SPLIT_EMOJI.encode() in b"".join(bytes(e.bytes) for e in partial)


def test_streamed_equals_non_streamed(client):
    full = ask(client).choices[0]
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert reasoning == full.message.model_extra["reasoning_content"]
    assert content == (full.message.content or "")
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in full.message.tool_calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == ask(client).usage.completion_tokens


def test_history_with_content_none_and_reasoning_is_accepted(client):
    first = ask(client).choices[0].message
    history = [*TOOL_PROMPT, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "5"}]
    assert history[1].get("content") is None and "reasoning_content" in history[1]
    history[1]["content"] = None  # as OpenAI sends it back
    response = client.chat.completions.create(model="qwen3-tiny", messages=history, tools=[ADD_TOOL], max_tokens=4,
                                              temperature=0)
    assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_enable_thinking_per_request(client):
    thinking = ask(client, max_tokens=1).usage.prompt_tokens
    off = ask(client, max_tokens=1, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    # the generation prompt gains the empty think block '<think>', '\n\n', '</think>', '\n\n'
    assert off.usage.prompt_tokens == thinking + 4


def test_render_failures_are_400_naming_message_and_field(server):
    base, _ = server
    cases = [
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], "messages[1].content"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}],
         "messages[1].tool_calls[0].function.arguments"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}],
         "messages[1].tool_calls[0].function"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": "hi", "name": 7}], "messages[0].name"),
        ([{"role": "tool", "content": 5}], "messages[0].content"),
    ]
    for messages, param in cases:
        response = httpx.post(f"{base}/v1/chat/completions", headers=AUTH, json={"messages": messages}, timeout=30)
        assert response.status_code == 400, (messages, response.text)
        error = response.json()["error"]
        assert error["param"] == param and error["message"].startswith(param), error
    response = httpx.post(f"{base}/v1/chat/completions", headers=AUTH, timeout=30,
                          json={"messages": TOOL_PROMPT, "tools": [{"type": "function"}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools[0].function"
