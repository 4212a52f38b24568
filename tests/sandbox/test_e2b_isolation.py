"""The isolation probes of test_isolation.py, repeated on sandboxes made through the E2B
API and driven by the real `e2b` SDK: each is a real attempt from inside to break out, and
each must stay contained."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading

import pytest
from tests.sandbox.cluster_helpers import until
from tests.sandbox.test_isolation import KERNEL_PROBES

e2b = pytest.importorskip("e2b", reason="the e2b SDK is in the dev extra")
from e2b import CommandExitException, Sandbox, TimeoutException  # noqa: E402

pytestmark = pytest.mark.needs_root  # real sandboxes: see conftest.py


def _run(sandbox: Sandbox, cmd: str, timeout: float = 30):
    """A command's result whatever its exit code: probes expect failures."""
    try:
        return sandbox.commands.run(cmd, timeout=timeout)
    except CommandExitException as failed:
        return failed
    except e2b.SandboxException as failed:  # e.g. no process slot left to start it in
        failed.stdout = ""
        return failed



def test_no_network_not_even_to_the_service_that_made_it(e2b_service):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(3)
    accepted: list = []
    waiter = threading.Thread(target=lambda: accepted.append(_accept(listener)))
    waiter.start()
    targets = [("127.0.0.1", listener.getsockname()[1]), ("127.0.0.1", e2b_service.port), ("8.8.8.8", 53)]
    with Sandbox.create() as sandbox:
        probe = "import socket\n" + "".join(
            f"try:\n    socket.create_connection({t!r}, timeout=2); print('CONNECTED')\n"
            "except OSError as e: print('refused')\n" for t in targets)
        sandbox.files.write("probe.py", probe)
        result = _run(sandbox, "python3 probe.py; cat /proc/net/dev")
        assert "CONNECTED" not in result.stdout and result.stdout.count("refused") == 3
        interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line and "|" not in line]
        assert interfaces == ["lo"]
    waiter.join()
    listener.close()
    assert accepted == [None]


def _accept(listener: socket.socket):
    try:
        listener.accept()[0].close()
        return "accepted"
    except OSError:
        return None


def test_cannot_see_or_signal_the_host_or_another_sandbox(e2b_service):
    with Sandbox.create() as a, Sandbox.create() as b:
        sleeper = b.commands.run("sleep 300", background=True)
        targets = [os.getpid(), os.getppid()]
        a.files.write("probe.sh", "ps -eo args; " + "; ".join(f"kill -9 {pid} 2>/dev/null && echo KILLED {pid}"
                                                            for pid in targets))
        result = _run(a, "bash probe.sh")
        assert not any(word in result.stdout for word in ("pytest", "node_server", "sleep", "KILLED"))
        assert sleeper.pid in {p.pid for p in b.commands.list()}
        assert a.commands.kill(sleeper.pid) is False  # a's envd knows no such process of its own
        assert sleeper.pid in {p.pid for p in b.commands.list()}
        sleeper.kill()


def test_cannot_write_outside_its_layer(e2b_service, tmp_path):
    marker = tmp_path / "marker"
    with Sandbox.create() as sandbox:
        attempts = ["/etc/evil", "/usr/evil", "/evil", "/proc/sys/kernel/hostname", "/dev/evil", str(marker)]
        script = "; ".join(f"(echo x > {path}) 2>/dev/null && echo WROTE {path}" for path in attempts)
        result = _run(sandbox, script + "; mount -t tmpfs none /workspace 2>/dev/null && echo MOUNTED; id -u")
        assert "WROTE" not in result.stdout and "MOUNTED" not in result.stdout
        assert result.stdout.split()[-1] != "0"
        for path in ("/etc/evil", "/usr/evil"):
            with pytest.raises(e2b.SandboxException):
                sandbox.files.write(path, "x")  # envd's own writes run as the sandbox too
        assert not marker.exists() and not os.path.exists("/etc/evil") and not os.path.exists("/usr/evil")


def test_cannot_read_another_sandboxs_files(e2b_service):
    with Sandbox.create() as a, Sandbox.create() as b:
        a.files.write("secret.txt", "TOPSECRET")
        layer = e2b_service.service.controller.routes[a.sandbox_id].layer
        result = _run(b, f"cat {layer}/upper/secret.txt; cat /workspace/secret.txt; "
                         "find / -path /proc -prune -o -path /usr -prune -o -name secret.txt -print 2>/dev/null; "
                         "grep -rs TOPSECRET /workspace /tmp /dev/shm", timeout=60)
        assert "TOPSECRET" not in result.stdout and "secret.txt" not in result.stdout
        assert not b.files.exists(f"{layer}/upper/secret.txt")
        assert a.files.read("secret.txt") == "TOPSECRET"


def test_kernel_surface_outside_the_box_is_denied(e2b_service):
    with Sandbox.create() as sandbox:
        sandbox.files.write("probes.py", KERNEL_PROBES)
        found = json.loads(sandbox.commands.run("python3 probes.py").stdout)
        enosys = {"clone3", "io_uring_setup"}
        assert found == {name: errno.ENOSYS if name in enosys else errno.EPERM for name in found}


def test_nested_user_namespaces_are_refused(e2b_service):
    with Sandbox.create() as sandbox:
        result = _run(sandbox, "unshare -Ur id; echo rc=$?; unshare -r --map-root-user true; echo rc=$?")
        assert "uid=0" not in result.stdout and result.stdout.count("rc=1") == 2


def test_fork_bomb_stops_at_pids_limit(e2b_service):
    with Sandbox.create() as sandbox:
        with pytest.raises(TimeoutException):  # its timeout kills the bomb's whole process group
            sandbox.commands.run("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=5)
        assert e2b_service.service.controller.metrics(sandbox.sandbox_id)["pids_refused"] > 0
        until(lambda: _run(sandbox, "echo survived", timeout=20).stdout == "survived\n", "the bomb to be gone")


def test_a_timed_out_command_takes_its_whole_tree_with_it(e2b_service):
    with Sandbox.create() as sandbox:
        with pytest.raises(TimeoutException):
            sandbox.commands.run("sleep 101 & setsid sleep 102 & (sleep 103 &) ; sleep 104", timeout=1)

        def left() -> str:
            return sandbox.commands.run("ps -eo args | grep -c '^sleep 10[1-4]$' || true").stdout.strip()

        until(lambda: left() == "0", "the sleeps of the timed-out command to die")
