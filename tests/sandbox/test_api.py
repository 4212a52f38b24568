"""The E2B-shaped API end to end: session state, files, pause/resume, metrics, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from pydantic import ValidationError

from venusrl.sandbox.api import AsyncSandbox, Sandbox
from venusrl.sandbox.errors import InvalidRequest, SandboxNotFound
from venusrl.sandbox.template import Template

pytestmark = pytest.mark.needs_root  # real sandboxes: see conftest.py

MiB = 1 << 20


@pytest.fixture
def sandbox(cluster):
    sb = Sandbox.create(cluster.controller)
    yield sb
    with contextlib.suppress(SandboxNotFound):
        sb.kill()


def test_shell_session_keeps_cwd_and_exports(sandbox):
    assert sandbox.run("mkdir -p /tmp/w && cd /tmp/w && export GREETING=hello && LOCAL=1").exit_code == 0
    result = sandbox.run('pwd; echo "$GREETING ${LOCAL:-unset}"')
    assert result.stdout == "/tmp/w\nhello unset\n"
    assert result.cwd == "/tmp/w"


def test_per_call_env_and_cwd(sandbox):
    assert sandbox.run("echo $ONCE", env={"ONCE": "yes"}).stdout == "yes\n"
    assert sandbox.run("echo ${ONCE:-gone}").stdout == "gone\n"
    assert sandbox.run("pwd", cwd="/tmp").stdout == "/tmp\n"


def test_exit_codes_and_streams(sandbox):
    result = sandbox.run("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
    assert sandbox.run("false").exit_code == 1
    assert sandbox.run("cd /nonexistent").exit_code == 1


def test_files_roundtrip(sandbox):
    sandbox.files.write("dir/a.txt", "alpha")
    sandbox.files.write("/tmp/b.bin", b"\x00\x01\xff")
    assert sandbox.files.read("dir/a.txt") == "alpha"
    assert sandbox.files.read("/tmp/b.bin", format="bytes") == b"\x00\x01\xff"
    assert [e["name"] for e in sandbox.files.list("dir")] == ["a.txt"]
    assert sandbox.run("cat /workspace/dir/a.txt").stdout == "alpha"
    with pytest.raises(InvalidRequest, match="missing.txt"):
        sandbox.files.read("missing.txt")


def test_template_files_are_a_shared_read_only_base(cluster):
    template = Template(name="with-files", files={"README": "base", "src/main.py": "print('hi')"})
    a = Sandbox.create(cluster.controller, template)
    b = Sandbox.create(cluster.controller, template)
    try:
        assert a.run("python3 src/main.py").stdout == "hi\n"
        a.run("echo changed > README; rm src/main.py")
        assert a.files.read("README") == "changed\n"
        assert b.files.read("README") == "base"
        assert b.run("ls src").stdout == "main.py\n"
    finally:
        a.kill()
        b.kill()


def test_pause_holds_a_command_until_resume(sandbox):
    sandbox.pause()
    assert sandbox.metrics()["paused"]
    assert not sandbox.metrics()["command_running"]
    results = []
    runner = threading.Thread(target=lambda: results.append(sandbox.run("echo ran", timeout=30)))
    runner.start()
    deadline = time.monotonic() + 30
    while not sandbox.metrics()["command_running"]:  # the request has reached the frozen sandbox
        assert time.monotonic() < deadline, "the command never reached the paused sandbox"
        time.sleep(0.01)
    assert not results and sandbox.metrics()["paused"]  # frozen: it cannot run
    sandbox.resume()
    runner.join(timeout=30)
    assert results[0].stdout == "ran\n" and not sandbox.metrics()["command_running"]


def test_metrics_report_real_memory(sandbox):
    sandbox.run("python3 -c 'import time; b = bytearray(32 << 20); time.sleep(0)'")
    m = sandbox.metrics()
    assert m["cgroup_bytes"] > 0 and m["processes"] >= 1
    assert m["rss_bytes"] >= m["pss_bytes"] >= m["uss_bytes"] > 0
    assert m["memory_limit"] == 512 * MiB


def test_template_pages_are_shared_between_sandboxes(cluster):
    template = Template(name="working-set", python_modules=("numpy",),
                        python_setup="data = numpy.ones(64 << 17)  # 64 MiB, touched")
    sandboxes = [Sandbox.create(cluster.controller, template, group_id="shared") for _ in range(2)]
    try:
        for sb in sandboxes:
            m = sb.metrics()
            assert m["rss_bytes"] > 64 * MiB  # the working set is mapped...
            assert m["cgroup_bytes"] < 24 * MiB  # ...but charged to the pool, not to the sandbox
        assert len({sb.metrics()["node_id"] for sb in sandboxes}) == 1  # one group, one node
    finally:
        for sb in sandboxes:
            sb.kill()


def test_async_api(cluster):
    async def main():
        sb = await AsyncSandbox.create(cluster.controller)
        try:
            await sb.write("x.txt", "async")
            results = await asyncio.gather(sb.run("cat x.txt"), sb.read("x.txt"))
            return results[0].stdout, results[1]
        finally:
            await sb.kill()

    assert asyncio.run(main()) == ("async", "async")


def test_bad_input_names_the_field(cluster, sandbox):
    controller = cluster.controller
    with pytest.raises(InvalidRequest, match="^timeout:"):
        sandbox.run("true", timeout=-1)
    with pytest.raises(InvalidRequest, match="^env:"):
        controller.run(sandbox.sandbox_id, "true", env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidRequest, match="^template:"):
        controller.create("no-such-template")
    with pytest.raises(InvalidRequest, match="^memory_limit:"):
        controller.create(memory_limit=0)
    with pytest.raises(InvalidRequest, match="^node_id:"):
        controller.create(node_id="node-9")
    with pytest.raises(SandboxNotFound, match="^sandbox_id:"):
        controller.run("nope", "true")
    with pytest.raises(ValidationError, match="name"):
        Template(name="bad name!")
    with pytest.raises(ValidationError, match="files"):
        Template(name="t", files={"../escape": "x"})
    sandbox.kill()
    with pytest.raises(SandboxNotFound):
        sandbox.run("true")


def test_broken_templates_fail_with_the_step_that_failed(cluster):
    from venusrl.sandbox.errors import TemplateError

    with pytest.raises(TemplateError, match="cannot import no_such_module"):
        cluster.controller.create(Template(name="broken-import", python_modules=("no_such_module",)))
    with pytest.raises(TemplateError, match="setup command 'exit 5' exited 5"):
        cluster.controller.create(Template(name="broken-setup", setup_commands=("exit 5",)))
    with pytest.raises(TemplateError, match="ZeroDivisionError"):
        cluster.controller.create(Template(name="broken-start", python_start="1 / 0"))
    healthy = Sandbox.create(cluster.controller)
    assert healthy.run("echo still-serving").stdout == "still-serving\n"
    healthy.kill()
