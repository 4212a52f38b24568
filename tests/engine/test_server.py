"""`venusrl serve` over real HTTP, driven by the official openai client."""

import json
import time

import httpx
import openai
import pytest
from tests.engine.serving import API_KEY, serving
from tests.engine.tool_model import ADD_TOOL, TOOL_PROMPT


@pytest.fixture(scope="module")
def server(tool_calling_model_dir):
    with serving(tool_calling_model_dir) as running:
        yield running


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key=API_KEY)


def test_chat_completion_with_logprobs(client):
    response = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=12, temperature=0, logprobs=True
    )
    choice = response.choices[0]
    assert response.usage.completion_tokens == len(choice.logprobs.content) <= 12
    assert choice.finish_reason in ("stop", "length")
    assert all(entry.logprob <= 0 for entry in choice.logprobs.content)


def test_greedy_is_deterministic_and_streaming_matches(client):
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "count"}], max_tokens=16, temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    again = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert full == again == streamed
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_tool_call_comes_back_as_tool_calls(client):
    response = client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, tools=[ADD_TOOL], max_tokens=64, temperature=0)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}


def test_streamed_tool_call(client):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=TOOL_PROMPT, tools=[ADD_TOOL], max_tokens=64, temperature=0, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [("add", {"a": 2, "b": 3})]
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_renders_without_tools(client):
    response = client.chat.completions.create(
        model="tiny", messages=TOOL_PROMPT, tools=[ADD_TOOL], tool_choice="none", max_tokens=8, temperature=0)
    assert response.choices[0].message.tool_calls is None


def test_bad_requests_get_openai_errors(client, server):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])
    assert "messages[0].role" in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-1)
    assert "temperature" in str(err.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=[99999], max_tokens=2)
    bad = openai.OpenAI(base_url=f"{server[0]}/v1", api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_completions_with_token_ids_and_priority(server):
    base, _ = server
    response = httpx.post(f"{base}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"}, json={
        "prompt": [10, 11, 12, 13], "max_tokens": 5, "temperature": 0, "logprobs": 0,
        "priority": "high", "trajectory_id": "traj-1"}, timeout=30)
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["choices"][0]["logprobs"]["token_logprobs"]) == body["usage"]["completion_tokens"]


def test_client_disconnect_aborts_and_frees_kv(server):
    base, engine = server
    with httpx.stream("POST", f"{base}/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"messages": [{"role": "user", "content": "go"}], "max_tokens": 2000,
                            "stream": True, "temperature": 1.0}, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:]).get("choices"):
                break
    deadline = time.time() + 10
    while time.time() < deadline:
        stats = httpx.get(f"{base}/stats", headers={"Authorization": f"Bearer {API_KEY}"}).json()
        if stats["running"] == 0 and stats["waiting"] == 0:
            break
        time.sleep(0.05)
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["kv_tokens"]["in_use"] == 0
