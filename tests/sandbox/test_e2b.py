"""The real `e2b` SDK against venusrl's E2B-compatible service on 127.0.0.1: agent code
written for E2B runs unchanged, in real sandboxes on real node agents."""

from __future__ import annotations

import os

import httpx
import pytest
from tests.sandbox.cluster_helpers import until

from venusrl.sandbox.e2b import connect

e2b = pytest.importorskip("e2b", reason="the e2b SDK is in the dev extra")
from e2b import (  # noqa: E402
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)

pytestmark = pytest.mark.needs_root  # real sandboxes: see conftest.py



def test_create_run_and_kill(e2b_service):
    sandbox = Sandbox.create(envs={"GREETING": "hi"}, metadata={"owner": "test"})
    try:
        result = sandbox.commands.run("echo $GREETING $EXTRA; echo oops >&2; pwd", envs={"EXTRA": "there"})
        assert (result.exit_code, result.stdout, result.stderr) == (0, "hi there\n/workspace\n", "oops\n")
        assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
        streamed = []
        sandbox.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=streamed.append)
        assert "".join(streamed) == "line1\nline2\nline3\n"
        assert sandbox.is_running()
        info = sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id and info.template_id == "base" and info.metadata == {"owner": "test"}
        assert sandbox.sandbox_id in {s.sandbox_id for s in Sandbox.list().next_items()}
    finally:
        assert sandbox.kill() is True
    assert not sandbox.is_running()
    assert Sandbox.kill(sandbox.sandbox_id) is False  # already gone: the SDK's not-found answer
    with pytest.raises(SandboxException):
        sandbox.commands.run("echo after")


def test_non_zero_exit_raises_the_sdks_command_exit_exception(e2b_service):
    with Sandbox.create() as sandbox:
        with pytest.raises(CommandExitException) as caught:
            sandbox.commands.run("echo partial; echo bad >&2; exit 7")
        assert (caught.value.exit_code, caught.value.stdout, caught.value.stderr) == (7, "partial\n", "bad\n")


def test_timeout_raises_timeout_exception_and_kills_the_command(e2b_service):
    with Sandbox.create() as sandbox:
        with pytest.raises(TimeoutException):
            sandbox.commands.run("sleep 30", timeout=1)
        until(lambda: not sandbox.commands.list(), "the timed-out command to be killed")


def test_background_command_is_listed_then_killed(e2b_service):
    with Sandbox.create() as sandbox:
        handle = sandbox.commands.run("echo started; sleep 300", background=True)
        assert handle.pid in {p.pid for p in sandbox.commands.list()}
        assert next(iter(handle)) == ("started\n", None, None)  # its output streams while it runs
        assert handle.kill() is True
        with pytest.raises(CommandExitException) as caught:
            handle.wait()
        assert caught.value.exit_code == -1 and caught.value.stdout == "started\n"
        assert handle.pid not in {p.pid for p in sandbox.commands.list()}
        assert sandbox.commands.kill(handle.pid) is False  # not found any more


def test_stdin_and_reattaching_to_a_running_command(e2b_service):
    with Sandbox.create() as sandbox:
        handle = sandbox.commands.run("read line; echo got:$line; cat", background=True, stdin=True)
        again = sandbox.commands.connect(handle.pid)
        sandbox.commands.send_stdin(handle.pid, "first\n")
        sandbox.commands.send_stdin(handle.pid, b"rest")
        sandbox.commands.close_stdin(handle.pid)
        result = handle.wait()
        assert (result.exit_code, result.stdout) == (0, "got:first\nrest")
        assert again.wait().exit_code == 0


def test_files_text_binary_and_a_megabyte(e2b_service):
    with Sandbox.create() as sandbox:
        info = sandbox.files.write("notes/hello.txt", "héllo\n")
        assert info.path == "/workspace/notes/hello.txt"
        assert sandbox.files.read("notes/hello.txt") == "héllo\n"
        blob = bytes(range(256)) * 4 + b"\r\n\x00\r\n"
        sandbox.files.write("/workspace/blob.bin", blob)
        assert bytes(sandbox.files.read("/workspace/blob.bin", format="bytes")) == blob
        big = os.urandom(1 << 20)
        sandbox.files.write("big.bin", big)
        assert bytes(sandbox.files.read("big.bin", format="bytes")) == big
        assert sandbox.commands.run("sha256sum big.bin | cut -c1-64").stdout.strip() == __import__("hashlib").sha256(big).hexdigest()
        entries = {e.name: e for e in sandbox.files.list("/workspace")}
        assert set(entries) == {"notes", "blob.bin", "big.bin"}
        assert entries["big.bin"].size == 1 << 20 and entries["notes"].type.value == "dir"
        assert [e.path for e in sandbox.files.list("/workspace", depth=2) if e.name == "hello.txt"] == [
            "/workspace/notes/hello.txt"]
        assert sandbox.files.exists("notes") and not sandbox.files.exists("missing")
        assert sandbox.files.make_dir("made/deep") is True and sandbox.files.make_dir("made/deep") is False
        moved = sandbox.files.rename("notes/hello.txt", "made/deep/hello.txt")
        assert moved.path == "/workspace/made/deep/hello.txt"
        sandbox.files.remove("made")
        assert not sandbox.files.exists("made")
        with pytest.raises(NotFoundException):
            sandbox.files.read("made/deep/hello.txt")


def test_connect_to_a_running_sandbox_and_its_lifetime(e2b_service):
    first = Sandbox.create(timeout=60)
    try:
        first.files.write("state.txt", "kept")
        second = Sandbox.connect(first.sandbox_id)
        assert second.commands.run("cat state.txt").stdout == "kept"
        first.set_timeout(120)
        assert (first.get_info().end_at - first.get_info().started_at).total_seconds() > 100
        first.pause()
        assert Sandbox.get_info(first.sandbox_id).state.value == "paused"
        with pytest.raises(SandboxException, match="paused"):
            first.files.read("state.txt")  # its init is frozen: refused at once, not left to hang
        resumed = Sandbox.connect(first.sandbox_id)  # connecting resumes a paused sandbox
        assert resumed.commands.run("cat state.txt").stdout == "kept"
    finally:
        first.kill()


def test_a_sandbox_past_its_timeout_is_killed(e2b_service):
    sandbox = Sandbox.create(timeout=1)
    until(lambda: not sandbox.is_running(), "the reaper to kill the expired sandbox")
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id)


def test_bad_credentials_and_unknown_templates_are_the_sdks_errors(e2b_service):
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_wrong")
    with pytest.raises(SandboxException, match="templateID"):
        Sandbox.create("no-such-template")
    with pytest.raises(SandboxException, match="allow_internet_access"):
        Sandbox.create(allow_internet_access=True)


def test_one_sandboxs_token_never_reaches_another(e2b_service):
    a, b = Sandbox.create(), Sandbox.create()
    try:
        a.files.write("secret.txt", "A-ONLY")
        url = e2b_service.url
        as_b = {"E2b-Sandbox-Id": a.sandbox_id, "X-Access-Token": b._envd_access_token}
        with httpx.Client(base_url=url, timeout=10) as http:
            assert http.get("/files", params={"path": "secret.txt"}, headers=as_b).status_code == 401
            assert http.post("/files", params={"path": "x"}, headers={**as_b, "Content-Type": "application/octet-stream"},
                             content=b"x").status_code == 401
            refused = http.post("/filesystem.Filesystem/ListDir", json={"path": "/workspace"}, headers=as_b)
            assert refused.status_code == 401 and refused.json()["code"] == "unauthenticated"
            started = http.post("/process.Process/Start", headers={**as_b, "Content-Type": "application/connect+json"},
                                content=connect.envelope({"process": {"cmd": "/bin/cat", "args": ["secret.txt"]}}))
            assert b"unauthenticated" in started.content and b"A-ONLY" not in started.content
            no_token = {"E2b-Sandbox-Id": a.sandbox_id}
            assert http.get("/files", params={"path": "secret.txt"}, headers=no_token).status_code == 401
            own = {"E2b-Sandbox-Id": a.sandbox_id, "X-Access-Token": a._envd_access_token}
            assert http.get("/files", params={"path": "secret.txt"}, headers=own).content == b"A-ONLY"
        assert not b.files.exists("secret.txt")
    finally:
        a.kill()
        b.kill()



def test_the_async_sdk_too(e2b_service):
    import asyncio

    from e2b import AsyncSandbox

    async def episode() -> tuple[str, bytes, int]:
        sandbox = await AsyncSandbox.create()
        try:
            await sandbox.files.write("in.bin", b"\x00\x01binary")
            result = await sandbox.commands.run("wc -c < in.bin; echo err >&2")
            handle = await sandbox.commands.run("sleep 60", background=True)
            killed = await handle.kill()
            return result.stdout + result.stderr, bytes(await sandbox.files.read("in.bin", format="bytes")), killed
        finally:
            await sandbox.kill()

    assert asyncio.run(episode()) == ("8\nerr\n", b"\x00\x01binary", True)
