"""Each test is a real attempt from inside a sandbox to break out of it."""

from __future__ import annotations

import os
import socket
import threading

from venusrl.sandbox.api import Sandbox
from venusrl.sandbox.template import Template

MiB = 1 << 20


def test_no_network(cluster):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted = []
    listener.settimeout(3)
    waiter = threading.Thread(target=lambda: accepted.append(_accept(listener)))
    waiter.start()
    sandbox = Sandbox.create(cluster.controller)
    try:
        probe = (
            "import socket\n"
            f"for target in [('127.0.0.1', {port}), ('8.8.8.8', 53), ('1.1.1.1', 443)]:\n"
            "    try:\n"
            "        socket.create_connection(target, timeout=2); print('CONNECTED', target)\n"
            "    except OSError as e: print('refused', target, e.errno)\n"
        )
        sandbox.files.write("probe.py", probe)
        result = sandbox.run("python3 probe.py; ls /sys/class/net 2>/dev/null; cat /proc/net/dev", timeout=20)
        assert "CONNECTED" not in result.stdout
        assert result.stdout.count("refused") == 3
        interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line and "|" not in line]
        assert interfaces == ["lo"]
        waiter.join()
        assert accepted == [None]
    finally:
        sandbox.kill()
        listener.close()


def _accept(listener: socket.socket):
    try:
        conn, _ = listener.accept()
        conn.close()
        return "accepted"
    except OSError:
        return None


def test_cannot_see_or_signal_host_or_other_sandboxes(cluster):
    a = Sandbox.create(cluster.controller)
    b = Sandbox.create(cluster.controller)
    try:
        b.run("sleep 300 >/dev/null 2>&1 &", timeout=5)
        b_pids = [p for p in _sandbox_pids(cluster, b)]
        targets = [os.getpid(), os.getppid(), *b_pids]  # host pids: the test runner, b's processes
        result = a.run(
            "ps -eo args; "
            + "; ".join(f"kill -9 {pid} 2>/dev/null && echo KILLED {pid}" for pid in targets),
            timeout=10,
        )
        listed = result.stdout.splitlines()
        assert len(listed) <= 4, listed  # header, its init, the shell, ps: nothing else (and no KILLED)
        assert not any("pytest" in line or "node_server" in line or "sleep" in line for line in listed)
        assert not any(line.startswith("KILLED") for line in listed)
        assert all(os.path.exists(f"/proc/{pid}") for pid in b_pids)
        assert b.run("echo alive").stdout == "alive\n"
    finally:
        a.kill()
        b.kill()


def _sandbox_pids(cluster, sandbox: Sandbox) -> list[int]:
    from venusrl.sandbox.cgroups import Cgroup, detect_layout

    route = cluster.controller.routes[sandbox.sandbox_id]
    node = cluster.nodes[route.node_id]
    return Cgroup(detect_layout(), f"{node.settings.cgroup}/sb-{sandbox.sandbox_id}").pids()


def test_cannot_write_outside_its_layer(cluster, tmp_path):
    sandbox = Sandbox.create(cluster.controller)
    host_marker = tmp_path / "marker"
    try:
        attempts = ["/etc/evil", "/usr/evil", "/evil", "/proc/sys/kernel/hostname", "/dev/evil",
                    str(host_marker), f"{cluster.workdir}/evil"]
        script = "; ".join(f"(echo x > {path}) 2>/dev/null && echo WROTE {path}" for path in attempts)
        script += "; mount -t tmpfs none /workspace 2>/dev/null && echo MOUNTED; id -u; echo ok > /workspace/mine && echo OWN"
        result = sandbox.run(script, timeout=10)
        assert "WROTE" not in result.stdout
        assert "MOUNTED" not in result.stdout
        assert "OWN" in result.stdout
        assert result.stdout.split()[-2] != "0"  # not root
        assert not host_marker.exists()
        assert not os.path.exists("/etc/evil") and not os.path.exists("/evil")
    finally:
        sandbox.kill()


def test_cannot_read_another_sandboxs_files(cluster):
    a = Sandbox.create(cluster.controller)
    b = Sandbox.create(cluster.controller)
    try:
        a.files.write("secret.txt", "TOPSECRET")
        a_layer = cluster.controller.routes[a.sandbox_id].layer
        result = b.run(f"cat {a_layer}/upper/secret.txt; cat /workspace/secret.txt; "
                       "find / -path /proc -prune -o -path /usr -prune -o -name secret.txt -print 2>/dev/null; "
                       "grep -rs TOPSECRET /workspace /tmp /dev/shm", timeout=60)
        assert "TOPSECRET" not in result.stdout and "secret.txt" not in result.stdout
        assert a.files.read("secret.txt") == "TOPSECRET"
    finally:
        a.kill()
        b.kill()


def test_fork_bomb_stops_at_pids_limit(cluster):
    sandbox = Sandbox.create(cluster.controller)
    try:
        result = sandbox.run("bomb() { bomb | bomb & }; bomb; sleep 3", timeout=5)
        metrics = sandbox.metrics()
        assert metrics["pids_refused"] > 0
        assert sandbox.run("echo survived", timeout=10).stdout == "survived\n"
        assert result.exit_code != 0 or result.timed_out
    finally:
        sandbox.kill()


def test_memory_bomb_stops_at_limit_without_harming_neighbours(cluster):
    bomb = Sandbox.create(cluster.controller, memory_limit=64 * MiB)
    neighbour = Sandbox.create(cluster.controller, memory_limit=64 * MiB)
    try:
        neighbour.files.write("state.txt", "before")
        result = bomb.run("python3 -c 'b = bytearray(512 << 20)'; echo rc=$?", timeout=30)
        assert "rc=137" in result.stdout  # SIGKILL from its own cgroup's OOM killer
        assert bomb.metrics()["oom_kills"] >= 1
        assert bomb.run("echo init-alive").stdout == "init-alive\n"
        assert neighbour.metrics()["oom_kills"] == 0
        assert neighbour.files.read("state.txt") == "before"
        for node in cluster.controller.nodes.values():
            assert node.call("status")["oom_events"] == 0  # the node budget was never hit
    finally:
        bomb.kill()
        neighbour.kill()


def test_timeout_kills_whole_process_tree(cluster):
    sandbox = Sandbox.create(cluster.controller)
    try:
        result = sandbox.run("sleep 101 & setsid sleep 102 & (sleep 103 &) ; sleep 104", timeout=1)
        assert result.timed_out
        left = sandbox.run("ps -eo comm,args | grep -c 'sleep 10[1-4]$'", timeout=10)
        assert left.stdout.strip() == "0"
    finally:
        sandbox.kill()


def test_random_state_is_reseeded_per_sandbox(cluster):
    template = Template(name="seeded", python_modules=("numpy",), python_setup="numpy.random.seed(0)",
                        python_start="open('/tmp/draw', 'w').write(repr(numpy.random.random()))")
    a = Sandbox.create(cluster.controller, template)
    b = Sandbox.create(cluster.controller, template)
    try:
        assert a.files.read("/tmp/draw") != b.files.read("/tmp/draw")
    finally:
        a.kill()
        b.kill()
