"""The embedded runtime's sandbox cluster: node agent processes on this machine plus a
controller connected to them over Unix sockets (or loopback TCP) with a fresh token.

Each node agent gets its own budget, cgroup subtree `venusrl-RUN/node-I` and work
directory. Closing the cluster (or the death of this process, which closes the agents'
stdin) removes every cgroup, sandbox and zygote it started.
"""

from __future__ import annotations

import logging
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from venusrl.sandbox.cgroups import Cgroup, detect_layout
from venusrl.sandbox.config import SandboxConfig
from venusrl.sandbox.controller import SandboxController
from venusrl.sandbox.errors import SandboxError
from venusrl.sandbox.node_agent import NodeSettings
from venusrl.sandbox.node_client import NodeClient
from venusrl.sandbox.quota import release_mounts_under

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0


@dataclass
class NodeProcess:
    settings: NodeSettings
    process: subprocess.Popen
    address: str


class LocalCluster:
    def __init__(self, config: SandboxConfig | None = None, budgets: list[int] | None = None) -> None:
        self.config = config or SandboxConfig()
        budgets = budgets or [int(self.config.node_memory)] * self.config.nodes
        self.run_id = uuid.uuid4().hex[:8]
        self.cgroup_root = f"venusrl-{self.run_id}"
        self._own_workdir = self.config.workdir is None
        self.workdir = Path(self.config.workdir or tempfile.mkdtemp(prefix="vrl-"))
        os.chmod(self.workdir, 0o700)  # sockets, layers and the token live here
        self.token = secrets.token_hex(32)
        self.nodes: dict[str, NodeProcess] = {}
        try:
            for index, budget in enumerate(budgets):
                self._start_node(f"node-{index}", budget)
            clients = [NodeClient(n.settings.node_id, n.address, self.token,
                                  call_grace_s=self.config.oom_grace_s + 30.0) for n in self.nodes.values()]
            self.controller = SandboxController(clients, on_node_lost=self._cleanup_node)
        except BaseException:
            self.close()
            raise

    def _start_node(self, node_id: str, budget: int) -> None:
        address = f"unix:{self.workdir}/{node_id}.sock" if self.config.transport == "unix" else "tcp:127.0.0.1:0"
        settings = node_settings(self.config, node_id, address, self.token, budget,
                                 f"{self.cgroup_root}/{node_id}", self.workdir / node_id)
        process, bound = start_node_process(settings)
        self.nodes[node_id] = NodeProcess(settings, process, bound)

    def kill_node(self, node_id: str) -> None:
        """SIGKILL one node agent (tests and fault injection)."""
        self.nodes[node_id].process.send_signal(signal.SIGKILL)

    def _cleanup_node(self, node_id: str) -> None:
        """A dead agent cannot clean up: its zygotes exit on their own, its cgroups are ours
        (its sandboxes' quota filesystems stay mounted: recovery reads their layers; close()
        releases them)."""
        node = self.nodes[node_id]
        node.process.wait()
        Cgroup(detect_layout(), node.settings.cgroup).remove()

    def close(self) -> None:
        controller = getattr(self, "controller", None)
        if controller is not None:
            controller.close()
        for node in self.nodes.values():
            ask_node_to_stop(node.process)
        for node in self.nodes.values():
            wait_for_node(node.process)
        Cgroup(detect_layout(), self.cgroup_root).remove()
        release_mounts_under(self.workdir)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def ask_node_to_stop(process: subprocess.Popen) -> None:
    """A node agent shuts down cleanly (removing its sandboxes) when its stdin closes."""
    if process.poll() is None and process.stdin is not None:
        process.stdin.close()


def wait_for_node(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


def node_settings(config: SandboxConfig, node_id: str, address: str, token: str, budget: int, cgroup: str,
                  workdir: Path) -> NodeSettings:
    return NodeSettings(node_id=node_id, address=address, token=token, budget=budget, cgroup=cgroup,
                        workdir=str(workdir), sandbox=config)


def start_node_process(settings: NodeSettings) -> tuple[subprocess.Popen, str]:
    """Start `python -m venusrl.sandbox.node_server` with `settings`; (process, the address
    it bound) once it reports READY."""
    process = subprocess.Popen(
        [sys.executable, "-m", "venusrl.sandbox.node_server"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
    assert process.stdin is not None and process.stdout is not None
    # The token travels on the pipe, never on a command line.
    process.stdin.write(settings.to_json().encode() + b"\n")
    process.stdin.flush()
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline().decode().strip() if ready else ""
    if not line.startswith("READY "):
        process.kill()
        process.wait()
        raise SandboxError(f"node agent {settings.node_id} did not start (exit {process.returncode}); see its log")
    return process, line.split(" ", 1)[1]
