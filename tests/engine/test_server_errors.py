"""Every client error gets a 4xx in OpenAI's error shape, naming the field, and the engine
goes on serving: bounded sampling parameters, parser-level errors, lone surrogates, unknown
models and routes, the API key on /stats."""

import httpx
import pytest
from tests.engine.serving import AUTH, serving

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    with serving(tiny_model_dir, kv_capacity_tokens=4096) as (url, _):
        yield url


def post(base, body=None, path="/v1/chat/completions", raw=None, headers=AUTH):
    if raw is not None:
        return httpx.post(base + path, content=raw, headers={**headers, "Content-Type": "application/json"}, timeout=60)
    return httpx.post(base + path, json=body, headers=headers, timeout=60)


def openai_error(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def served(base):
    response = post(base, {"messages": HELLO, "max_tokens": 3, "temperature": 0})
    return response.status_code == 200 and response.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("field,value", [
    ("temperature", 1e-300), ("temperature", 3.0), ("temperature", -1), ("seed", 2**64), ("seed", -1),
    ("top_p", 0), ("top_p", 1.5), ("top_k", 2**70), ("top_k", -2), ("presence_penalty", 0.5),
    ("frequency_penalty", -3), ("repetition_penalty", 1.3), ("max_tokens", 0), ("max_tokens", 10**9),
    ("max_completion_tokens", 2**40), ("priority", True), ("priority", 7), ("priority", "urgent"), ("n", 2),
    ("stop", ["a", "b", "c", "d", "e"]), ("stop", [""]), ("trajectory_id", "x" * 300), ("trajectory_id", ""),
    ("stream", "yes"), ("logprobs", 1), ("top_logprobs", 5), ("chat_template_kwargs", {"messages": []}),
    ("chat_template_kwargs", "thinking"), ("tool_choice", "sometimes"), ("stream_options", {"include_usage": 2}),
])
def test_bad_sampling_fields_are_400_naming_the_field_and_the_engine_serves_on(base, field, value):
    error = openai_error(post(base, {"messages": HELLO, field: value}), 400)
    assert error["param"].split(".")[0] == field and error["type"] == "invalid_request_error"
    assert served(base)


def test_prompt_past_the_context_is_400(base):
    openai_error(post(base, {"messages": HELLO, "max_tokens": 4095}), 400, "max_tokens")
    openai_error(post(base, {"messages": [{"role": "user", "content": "x " * 5000}]}), 400, "messages")
    openai_error(post(base, {"prompt": list(range(5000)), "max_tokens": 1}, path="/v1/completions"), 400, "prompt")
    openai_error(post(base, {"prompt": [10**30], "max_tokens": 1}, path="/v1/completions"), 400, "prompt")
    assert served(base)


@pytest.mark.parametrize("raw,param", [
    (b'{"messages": [', None), (b"", None), (b"[]", None), (b'"hi"', None), (b"\xff\xfe\x00garbage", None),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": "ok", "\\udfff": 1}]}', None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}', "top_p"),
    (b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", None),
])
def test_parser_level_errors_are_openai_shaped_400s(base, raw, param):
    error = openai_error(post(base, raw=raw), 400, param)
    assert "\\ud800" not in error["message"] or param  # surrogates are named, never echoed raw
    assert served(base)


def test_unknown_model_is_404_model_not_found(base):
    error = openai_error(post(base, {"model": "gpt-9", "messages": HELLO}), 404, "model")
    assert error["code"] == "model_not_found"
    error = openai_error(post(base, {"model": "gpt-9", "prompt": "hi"}, path="/v1/completions"), 404)
    assert error["code"] == "model_not_found"
    assert post(base, {"model": "tiny", "messages": HELLO, "max_tokens": 2}).status_code == 200


def test_unknown_routes_and_methods_are_openai_shaped(base):
    assert openai_error(httpx.get(f"{base}/v1/engines", headers=AUTH), 404)["code"] == "not_found"
    assert openai_error(httpx.delete(f"{base}/v1/chat/completions", headers=AUTH), 405)["code"] == "method_not_allowed"


def test_stats_and_the_api_need_the_key_health_does_not(base):
    assert openai_error(httpx.get(f"{base}/stats"), 401)["type"] == "authentication_error"
    assert openai_error(httpx.get(f"{base}/stats", headers={"Authorization": "Bearer nope"}), 401)
    assert httpx.get(f"{base}/stats", headers=AUTH).status_code == 200
    openai_error(post(base, {"messages": HELLO}, headers={}), 401)
    assert httpx.get(f"{base}/health").status_code == 200
