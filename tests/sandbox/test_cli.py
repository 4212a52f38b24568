"""`venusrl sandbox exec`, run as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_root  # real sandboxes: see conftest.py

VENUSRL = Path(sys.executable).parent / "venusrl"  # the installed console script


def _venusrl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENUSRL), *args], capture_output=True, text=True, timeout=timeout)


def test_exec_prints_output_and_returns_the_exit_code():
    done = _venusrl("sandbox", "exec", "--", "sh", "-c", "echo out; echo err >&2; hostname | wc -c; exit 7")
    assert done.returncode == 7
    assert done.stdout.startswith("out\n")
    assert "err" in done.stderr


def test_exec_timeout_kills_and_reports():
    done = _venusrl("sandbox", "exec", "--timeout", "1", "--", "sleep", "30")
    assert done.returncode == 124
    assert "timed out" in done.stderr


def test_exec_bad_input_names_the_option():
    done = _venusrl("sandbox", "exec", "--template", "nope", "--", "true")
    assert done.returncode == 2
    assert "--template" in done.stderr


def test_serve_runs_node_agents_a_controller_can_attach_to(tmp_path):
    import os
    import signal
    import time

    from venusrl.sandbox.api import Sandbox
    from venusrl.sandbox.controller import SandboxController

    info = tmp_path / "nodes.json"
    config = tmp_path / "config.yaml"
    config.write_text("sandbox:\n  nodes: 2\n  cold_start_default: 32MiB\n")
    server = subprocess.Popen([str(VENUSRL), "sandbox", "serve", str(config), "--info", str(info)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.stat(info).st_mode & 0o077 == 0  # the token is the owner's alone
        controller = SandboxController.attach(info)
        try:
            assert sorted(controller.nodes) == ["node-0", "node-1"]
            assert Sandbox.create(controller).run("echo attached").stdout == "attached\n"
        finally:
            controller.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert not info.exists()


def test_serve_e2b_answers_the_e2b_sdk(tmp_path):
    import json
    import os
    import signal
    import time

    pytest.importorskip("e2b", reason="the e2b SDK is in the dev extra")
    info = tmp_path / "nodes.json"
    server = subprocess.Popen([str(VENUSRL), "sandbox", "serve", "--info", str(info), "--e2b", "--e2b-port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (info.exists() and info.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.1)
        e2b = json.loads(info.read_text())["e2b"]
        env = {**os.environ, "E2B_API_URL": e2b["url"], "E2B_SANDBOX_URL": e2b["url"], "E2B_API_KEY": e2b["api_key"]}
        agent = "from e2b import Sandbox\nwith Sandbox.create() as s: print(s.commands.run('echo via-e2b').stdout, end='')"
        done = subprocess.run([sys.executable, "-c", agent], env=env, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout) == (0, "via-e2b\n"), done.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert not info.exists()
