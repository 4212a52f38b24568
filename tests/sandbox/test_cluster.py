"""Controller and node agents over their real sockets: placement, redirect, transport
security, crash and node-loss recovery, OOM interception with migration."""

from __future__ import annotations

import os
import signal
import time

import pytest
from tests.sandbox.cluster_helpers import MiB, make_cluster

from venusrl.sandbox.api import Sandbox
from venusrl.sandbox.cgroups import Cgroup, detect_layout
from venusrl.sandbox.errors import (
    AuthenticationError,
    CapacityError,
    InvalidRequest,
    SandboxUnavailable,
)
from venusrl.sandbox.node_client import NodeClient

pytestmark = pytest.mark.needs_root  # real sandboxes: see conftest.py


def _retry(fn, timeout=60.0):
    """What a caller does with a retryable error: try again until it works."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except SandboxUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_group_affinity_then_redirect_when_the_node_refuses():
    cluster = make_cluster([56 * MiB, 1024 * MiB])
    try:
        c = cluster.controller
        first = c.create(group_id="g", node_id="node-0")
        second = c.create(group_id="g")  # node-0 holds the group but is too full: redirected
        assert c.routes[first].node_id == "node-0"
        assert c.routes[second].node_id == "node-1"
        third = c.create(group_id="g2")
        fourth = c.create(group_id="g2")
        assert c.routes[third].node_id == c.routes[fourth].node_id  # affinity when there is room
    finally:
        cluster.close()


def test_declared_admission_counts_declared_sizes():
    cluster = make_cluster([1024 * MiB], admission="declared")
    try:
        for _ in range(2):
            cluster.controller.create(memory_limit=512 * MiB)
        with pytest.raises(CapacityError, match="redirect"):
            cluster.controller.create(memory_limit=512 * MiB)
    finally:
        cluster.close()


def test_node_agent_requires_its_token_and_loopback(cluster):
    node = next(iter(cluster.nodes.values()))
    with pytest.raises(AuthenticationError):
        NodeClient(node.settings.node_id, node.address, "wrong-token").call("status")
    with pytest.raises(InvalidRequest, match="^address: node agents listen on loopback only"):
        NodeClient("x", "tcp:10.0.0.1:9000", "t")
    assert os.stat(node.address.removeprefix("unix:")).st_mode & 0o077 == 0  # owner only


def test_loopback_tcp_transport():
    cluster = make_cluster([512 * MiB], transport="tcp")
    try:
        assert next(iter(cluster.nodes.values())).address.startswith("tcp:127.0.0.1:")
        sb = Sandbox.create(cluster.controller)
        assert sb.run("echo tcp").stdout == "tcp\n"
    finally:
        cluster.close()


def test_crashed_sandbox_restarts_with_its_files_and_session(cluster):
    sb = Sandbox.create(cluster.controller)
    try:
        sb.files.write("kept.txt", "still here")
        sb.run("cd /tmp && export MARK=7")
        route = cluster.controller.routes[sb.sandbox_id]
        node = cluster.nodes[route.node_id]
        cgroup = Cgroup(detect_layout(), f"{node.settings.cgroup}/sb-{sb.sandbox_id}")
        for pid in cgroup.pids():
            os.kill(pid, signal.SIGKILL)  # the init and its keeper die under the agent
        with pytest.raises(SandboxUnavailable):
            sb.run("true")
        result = _retry(lambda: sb.run("pwd; echo $MARK; cat /workspace/kept.txt"))
        assert result.stdout == "/tmp\n7\nstill here"
    finally:
        sb.kill()


def test_dead_node_agent_loses_nothing():
    cluster = make_cluster([512 * MiB, 512 * MiB])
    try:
        c = cluster.controller
        sb = Sandbox(c, c.create(node_id="node-0"))
        sb.files.write("notes.txt", "survives")
        sb.run("mkdir -p /tmp/deep && cd /tmp/deep && export PHASE=two")
        cluster.kill_node("node-0")
        started = time.monotonic()
        result = _retry(lambda: sb.run("pwd; echo $PHASE; cat /workspace/notes.txt", timeout=10))
        assert result.stdout == "/tmp/deep\ntwo\nsurvives"
        assert c.routes[sb.sandbox_id].node_id == "node-1"
        assert sb.sandbox_id in c.recoveries
        assert time.monotonic() - started < 60
        assert not Cgroup(detect_layout(), cluster.nodes["node-0"].settings.cgroup).exists()
        with pytest.raises(CapacityError):
            c.create(node_id="node-0")
    finally:
        cluster.close()


def test_oom_is_intercepted_and_the_largest_sandbox_migrates():
    cluster = make_cluster([200 * MiB, 1024 * MiB])
    try:
        c = cluster.controller
        big = Sandbox(c, c.create(node_id="node-0"))
        small = Sandbox(c, c.create(node_id="node-0"))
        big.files.write("before.txt", "precious")
        big.run("cd /tmp && export KEEP=1")
        small.files.write("small.txt", "stays")
        # 250 MiB cannot fit in the node's 200 MiB: the node must freeze, move `big`, thaw.
        result = big.run("python3 -c \"b = bytearray(250 << 20); open('/workspace/after.txt', 'w').write('ok')\"; "
                         "echo $KEEP; pwd", timeout=60)
        assert result.exit_code == 0
        assert result.stdout == "1\n/tmp\n"
        assert c.routes[big.sandbox_id].node_id == "node-1"
        assert c.routes[small.sandbox_id].node_id == "node-0"  # largest-first: only one moved
        assert big.files.read("before.txt") == "precious" and big.files.read("after.txt") == "ok"
        assert small.files.read("small.txt") == "stays"
        assert [m.sandbox_id for r in c.oom_records for m in r.migrations] == [big.sandbox_id]
        for node in c.nodes.values():
            assert node.call("status")["oom_kills"] == 0
    finally:
        cluster.close()


def test_malformed_requests_get_errors_and_the_agent_keeps_serving(cluster):
    from venusrl.sandbox import protocol, transport

    node = next(iter(cluster.nodes.values()))
    client = NodeClient(node.settings.node_id, node.address, cluster.token)
    with pytest.raises(InvalidRequest, match="^op: unknown operation"):
        client.call("explode")
    with pytest.raises(InvalidRequest, match="^template"):
        client.call("create", sandbox_id="x1", template={"name": "bad name"})
    with pytest.raises(InvalidRequest, match="^sandbox_id"):
        client.call("create", sandbox_id="../escape", template={"name": "base"})
    sock = transport.connect(node.address, 5)
    stream = sock.makefile("rwb")
    protocol.send(stream, {"token": cluster.token})
    assert protocol.receive(stream)["ok"]
    stream.write(b"this is not json\n")
    stream.flush()
    assert protocol.receive(stream) is None  # the agent drops the connection...
    sock.close()
    assert client.call("status")["node_id"] == node.settings.node_id  # ...and serves on
