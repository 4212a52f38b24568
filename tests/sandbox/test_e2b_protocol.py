"""The E2B service's wire handling: the Connect codec and the multipart parser (pure,
property-tested), and a fuzz of every endpoint with malformed requests (real service):
each answer is a 4xx naming what was wrong (or a stream's error envelope), never a 500."""

from __future__ import annotations

import json
import random
import struct

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.sandbox.e2b import connect
from venusrl.sandbox.e2b.connect import ConnectError
from venusrl.sandbox.e2b.errors import RestError
from venusrl.sandbox.e2b.multipart import parse_multipart

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=8)


@given(st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_a_stream_request_envelope_round_trips(message):
    assert connect.parse_stream_request(connect.envelope(message)) == message


@given(st.binary(max_size=64))
def test_any_stream_body_parses_or_is_invalid_argument(body):
    try:
        assert isinstance(connect.parse_stream_request(body), dict)
    except ConnectError as err:
        assert err.code == "invalid_argument" and err.message.startswith("body:")


def test_end_of_stream_carries_the_error():
    frame = connect.end_of_stream(ConnectError("not_found", "process.pid: gone"))
    flags, length = struct.unpack(">BI", frame[:5])
    assert flags == connect.END_STREAM and json.loads(frame[5:5 + length]) == {
        "error": {"code": "not_found", "message": "process.pid: gone"}}
    assert json.loads(connect.end_of_stream()[5:]) == {}


@settings(max_examples=60)
@given(st.lists(st.tuples(st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30)
                          .filter(lambda n: '"' not in n and "\\" not in n),
                          st.binary(max_size=300)), min_size=1, max_size=4))
def test_multipart_bodies_as_httpx_builds_them_parse_exactly(files):
    request = httpx.Request("POST", "http://x/files", files=[("file", (name, data)) for name, data in files])
    body = request.read()
    assert parse_multipart(body, request.headers["content-type"]) == [(name, data) for name, data in files]


@given(st.binary(max_size=200))
def test_any_multipart_body_parses_or_is_a_400(body):
    try:
        parse_multipart(body, "multipart/form-data; boundary=XyZ")
    except RestError as err:
        assert err.status == 400


def test_int64_fields_may_come_as_strings_and_wrong_types_name_the_field():
    assert connect.field({"depth": "3"}, "depth", int) == 3
    with pytest.raises(ConnectError, match="^depth: expected int"):
        connect.field({"depth": [1]}, "depth", int)
    with pytest.raises(ConnectError, match="process.tag"):
        connect.selected_pid({"process": {"tag": "t"}})


@pytest.mark.parametrize("text", ["\u00b2", "1\u00b9", "\u0663"])  # digits to str.isdigit, not to int()
def test_non_ascii_digits_are_invalid_arguments_not_500s(text):
    with pytest.raises(ConnectError, match="pid"):
        connect.field({"pid": text}, "pid", int)
    with pytest.raises(ConnectError, match="Connect-Timeout-Ms"):
        connect.timeout_ms(text)


# -- fuzz against the real service ---------------------------------------------------------
ENVD_RPCS = ["/process.Process/Start", "/process.Process/Connect", "/process.Process/List",
             "/process.Process/SendInput", "/process.Process/SendSignal", "/process.Process/CloseStdin",
             "/process.Process/Update", "/filesystem.Filesystem/Stat", "/filesystem.Filesystem/ListDir",
             "/filesystem.Filesystem/MakeDir", "/filesystem.Filesystem/Move", "/filesystem.Filesystem/Remove",
             "/filesystem.Filesystem/WatchDir"]
STREAMS = {"/process.Process/Start", "/process.Process/Connect", "/filesystem.Filesystem/WatchDir"}
REST = [("POST", "/sandboxes"), ("POST", "/v2/sandboxes"), ("GET", "/v2/sandboxes"), ("POST", "/sandboxes/{id}/timeout"),
        ("POST", "/v2/sandboxes/{id}/connect"), ("POST", "/sandboxes/{id}/pause"), ("POST", "/sandboxes/{id}/refreshes"),
        ("GET", "/sandboxes/{id}"), ("DELETE", "/sandboxes/nope")]
FIELDS = ["process", "cmd", "args", "envs", "cwd", "stdin", "pid", "input", "signal", "path", "depth", "source",
          "destination", "templateID", "timeout", "metadata", "envVars", "duration", "tag", "pty"]
WEIRD = [None, True, -1, 0, 2 ** 63, "", "x", "\x00", "../../etc", [], {}, [1, "a"], {"pid": "x"}, {"cmd": 3},
         {"pid": -5}, {"stdin": "!!notbase64"}, 1.5, "SIGNAL_SIGKILL", {"a": 1}]


def _fuzz_message(rng: random.Random) -> dict:
    return {rng.choice(FIELDS): rng.choice(WEIRD) for _ in range(rng.randint(0, 4))}


def _body(rng: random.Random, message: dict) -> bytes:
    kind = rng.random()
    if kind < 0.1:
        return rng.randbytes(rng.randint(0, 12))
    if kind < 0.2:
        return json.dumps(rng.choice(WEIRD)).encode()
    return json.dumps(message).encode()


@pytest.mark.needs_root
def test_malformed_requests_are_4xx_naming_the_field_never_500(e2b_service):
    from e2b import Sandbox

    rng = random.Random(39)
    sandbox = Sandbox.create()
    try:
        own = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token}
        key = {"X-API-Key": "e2b_test_key"}
        with httpx.Client(base_url=e2b_service.url, timeout=30) as http:
            for _ in range(250):
                rpc = rng.choice(ENVD_RPCS)
                message = _fuzz_message(rng)
                if rpc in STREAMS:
                    raw = _body(rng, message)
                    content = struct.pack(">BI", 0, len(raw)) + raw if rng.random() < 0.8 else raw
                    reply = http.post(rpc, content=content, headers={**own, "Content-Type": "application/connect+json",
                                                                     "Connect-Timeout-Ms": "500"})
                    assert reply.status_code == 200, (rpc, message, reply.text)
                    last = _last_envelope(reply.content)
                    if "error" in last:  # a rejected request: a client-side code, naming the field
                        assert last["error"]["code"] in {"invalid_argument", "not_found", "unimplemented",
                                                         "deadline_exceeded", "already_exists"}, (rpc, message, last)
                else:
                    reply = http.post(rpc, content=_body(rng, message), headers={**own, "Content-Type": "application/json"})
                    assert reply.status_code < 500 or reply.json()["code"] == "unimplemented", (rpc, message, reply.text)
                    if reply.status_code >= 400:
                        assert ":" in reply.json()["message"], (rpc, message, reply.text)
            for _ in range(120):
                method, path = rng.choice(REST)
                # Bodies are checked before the sandbox is looked up: an unknown id still
                # exercises them, and the fuzz does not pause or expire the sandbox it probes.
                path = path.replace("{id}", sandbox.sandbox_id if method == "GET" else "nope")
                message = _fuzz_message(rng)
                reply = http.request(method, path, content=_body(rng, message), headers=key,
                                     params={"state": rng.choice(["running", "bogus", "paused,running"])})
                assert reply.status_code < 500, (method, path, message, reply.text)
                if reply.status_code >= 400:
                    assert set(reply.json()) == {"code", "message"}, reply.text
            for junk in (b"", b"\x00\x00", b"not json", b"{}"):
                reply = http.post("/files", content=junk, headers={**own, "Content-Type": "multipart/form-data; boundary=b"})
                assert reply.status_code == 400
        assert sandbox.commands.run("echo still fine").stdout == "still fine\n"
    finally:
        sandbox.kill()


def _last_envelope(content: bytes) -> dict:
    last, offset = {}, 0
    while offset + 5 <= len(content):
        _, length = struct.unpack(">BI", content[offset:offset + 5])
        last = json.loads(content[offset + 5:offset + 5 + length])
        offset += 5 + length
    assert offset == len(content), "trailing bytes after the last envelope"
    return last


@given(st.sampled_from(sorted(__import__("venusrl.sandbox.envd_request", fromlist=["OPS"]).OPS)),
       st.dictionaries(st.sampled_from(["cmd", "args", "env", "cwd", "stdin", "tag", "pid", "wait_s", "data",
                                        "signal", "path", "depth", "destination", "extra"]), json_values, max_size=6))
def test_the_node_agent_passes_on_only_checked_fields_or_names_the_bad_one(op, fields):
    from venusrl.sandbox import envd_request
    from venusrl.sandbox.errors import InvalidRequest

    try:
        call = envd_request.checked({"op": op, **fields})
    except InvalidRequest as err:
        assert str(err).split(":")[0] in fields or str(err).split(":")[0] in ("cmd", "pid", "path", "data", "signal",
                                                                               "depth", "destination")
        return
    assert call["op"] == op and "extra" not in call
    assert all(k in fields or call[k] in (None, False, [], {}, 0.0) for k in call if k != "op")


def test_exit_statuses_read_as_envd_reports_them():
    import signal

    from venusrl.sandbox.processes import _describe_status

    assert _describe_status(3 << 8) == {"exit_code": 3, "normal_exit": True,
                                                                          "status": "exit status 3"}
    assert _describe_status(signal.SIGKILL) == {"exit_code": -1, "normal_exit": False, "status": "signal: killed"}
    assert _describe_status(signal.SIGTERM)["status"] == "signal: terminated"
