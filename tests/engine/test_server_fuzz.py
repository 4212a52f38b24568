"""Property-based fuzzing of the HTTP API over its request schema, on the official Qwen3
template: whatever a client sends, the answer is 2xx or a 4xx in OpenAI's error shape, never
a 5xx or a dropped connection, and the engine serves the next request.

Each request is a valid one with up to two fields corrupted (to an edge value of that field,
or to any JSON value at all), so that the fuzz reaches the engine as well as the validation."""

import json
import math
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.engine.serving import AUTH, serving
from tests.engine.tool_model import ADD_TOOL

TRICKY = ["\ud800", "\udfff", "<think>", "</think>", "<tool_call>", "{{ x }}", "{% if %}", "<|im_end|>", "\x00", "🫠"]
clean = st.lists(st.one_of(st.characters(exclude_categories=["Cs"]), st.sampled_from(TRICKY[2:])), max_size=6).map("".join)
text = st.lists(st.one_of(st.characters(), st.sampled_from(TRICKY)), max_size=6).map("".join)
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), text)
anything = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                        max_leaves=6)
CALL = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
conversation = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": clean}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.one_of(clean, st.none()),
                           "tool_calls": st.just([CALL])}, optional={"reasoning_content": clean}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": clean}, optional={"reasoning_content": clean}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": clean, "tool_call_id": st.just("call_0")}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": clean}), min_size=1, max_size=2)}),
), min_size=1, max_size=4)
message_edges = st.one_of(
    anything,
    st.fixed_dictionaries({"role": anything}, optional={"content": anything}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none()}, optional={"tool_calls": st.one_of(
        anything, st.lists(st.fixed_dictionaries({}, optional={"function": st.one_of(anything, st.fixed_dictionaries(
            {}, optional={"name": anything, "arguments": st.one_of(anything, st.just("{oops"))}))}), max_size=2))}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "tool", "system"]), "content": st.one_of(text, anything)},
                          optional={"name": anything, "tool_call_id": anything, "reasoning_content": anything}),
)
FIELDS = {  # name: (valid values, edge values)
    "model": (st.just("qwen3-tiny"), st.sampled_from(["gpt-4o", ""])),
    "max_tokens": (st.integers(1, 4), st.sampled_from([-1, 0, 10**9, 2**80, 1.5])),
    "max_completion_tokens": (st.integers(1, 4), st.sampled_from([0, 5000])),
    "temperature": (st.one_of(st.just(0.0), st.floats(0.01, 2)), st.sampled_from([1e-300, 1e-30, -1, 3, math.nan, math.inf])),
    "top_p": (st.floats(0.01, 1), st.sampled_from([0, -0.1, 1.5, math.nan])),
    "top_k": (st.integers(-1, 50), st.sampled_from([-3, 2**66, 2**31])),
    "seed": (st.integers(0, 2**63 - 1), st.sampled_from([2**64, 2**63, -1, 2**200])),
    "presence_penalty": (st.just(0), st.floats(-3, 3)),
    "frequency_penalty": (st.just(0), st.floats(-3, 3)),
    "repetition_penalty": (st.just(1), st.floats(0, 3)),
    "stop": (st.lists(clean.filter(bool), max_size=2), st.one_of(st.just([""]), st.lists(text, min_size=5, max_size=6))),
    "n": (st.just(1), st.sampled_from([0, 2, True])),
    "stream": (st.booleans(), st.sampled_from(["yes", 1, None])),
    "stream_options": (st.fixed_dictionaries({"include_usage": st.booleans()}), st.just({"include_usage": 2})),
    "priority": (st.sampled_from([0, 1, 2, "high", "low", "promoted"]), st.sampled_from([True, False, 3, -1, "urgent"])),
    "trajectory_id": (st.text(min_size=1, max_size=20), st.sampled_from(["", "x" * 300, "\ud800"])),
}
CHAT_FIELDS = {
    **FIELDS,
    "messages": (conversation, st.one_of(anything, st.lists(message_edges, min_size=1, max_size=3))),
    "tools": (st.just([ADD_TOOL]), st.one_of(anything, st.just([{"type": "function"}]), st.just([{
        "type": "function", "function": {"name": "f", "parameters": {"required": 3, "properties": {"x": {"type": {}}}}}}]))),
    "tool_choice": (st.sampled_from(["auto", "none"]), st.sampled_from(["required", 5])),
    "logprobs": (st.booleans(), st.sampled_from([1, "x"])),
    "top_logprobs": (st.just(0), st.sampled_from([-1, 5])),
    "chat_template_kwargs": (st.fixed_dictionaries({"enable_thinking": st.booleans()}),
                             st.sampled_from([{"messages": 1}, {"tools": None}, "x", {"enable_thinking": "maybe"}])),
}
COMPLETION_FIELDS = {
    **FIELDS,
    "prompt": (st.one_of(clean.filter(bool), st.lists(st.integers(0, 150_000), min_size=1, max_size=6)),
               st.one_of(st.just([]), st.just(""), st.lists(st.integers(-5, 10**20), min_size=1, max_size=3))),
    "logprobs": (st.just(0), st.sampled_from([1, -1, True])),
    "echo": (st.just(False), st.sampled_from([True, "no"])),
}


@st.composite
def requests(draw, fields, required):
    body = {name: draw(fields[name][0]) for name in required}
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=6, unique=True)):
        body[name] = draw(fields[name][0])
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True)):
        body[name] = draw(st.one_of(fields[name][1], anything))
    if draw(st.integers(0, 9)) == 0:
        body[draw(text)] = draw(anything)  # an unknown field
    return body


request = st.one_of(st.tuples(st.just("/v1/chat/completions"), requests(CHAT_FIELDS, ["messages"])),
                    st.tuples(st.just("/v1/completions"), requests(COMPLETION_FIELDS, ["prompt"])))
STATUSES: Counter = Counter()  # answers seen by the fuzz tests, by status code


@pytest.fixture(scope="module")
def api(qwen3_model_dir):
    with (serving(qwen3_model_dir, model_name="qwen3-tiny", kv_capacity_tokens=4096, default_max_tokens=4) as (base, _),
          httpx.Client(base_url=base, headers=AUTH, timeout=120) as client):
        yield client


def send(api, path, body):
    raw = json.dumps(body, allow_nan=True)  # NaN and Infinity as a lax client writes them
    with api.stream("POST", path, content=raw, headers={"Content-Type": "application/json"}) as response:
        payload = response.read()  # a stream dropped mid-way raises here
    assert response.status_code < 500, (path, body, payload[:500])
    if response.status_code >= 400:
        error = json.loads(payload)["error"]
        assert set(error) == {"message", "type", "param", "code"}, payload
    elif body.get("stream") is True:
        assert payload.rstrip().endswith(b"data: [DONE]") and b"server_error" not in payload, payload[-300:]
    STATUSES[response.status_code] += 1
    return response.status_code


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request=request)
def test_no_request_gets_a_5xx(api, request):
    send(api, *request)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages=st.one_of(conversation, st.lists(message_edges, min_size=1, max_size=3),
                          st.tuples(conversation, message_edges).map(lambda pair: [*pair[0], pair[1]])),
       tools=st.none() | st.just([ADD_TOOL]))
def test_malformed_messages_get_only_4xx(api, messages, tools):
    body = {"messages": messages, "max_tokens": 1, **({"tools": tools} if tools else {})}
    assert send(api, "/v1/chat/completions", body) in (200, 400)


def test_engine_serves_after_the_fuzz(api):
    """Runs after the fuzz tests in this module (pytest keeps file order). The fuzz reached
    the engine (many requests were served) as well as the validation."""
    response = api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert response.status_code == 200 and api.get("/health").status_code == 200
    print(f"fuzz answers by status: {dict(STATUSES)}")
    assert sum(STATUSES.values()) >= 1300 and STATUSES[200] >= 200 and STATUSES[400] >= 200, STATUSES
