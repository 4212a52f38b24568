"""A real multi-node Ray cluster on this machine: each node a `ray start` in its own network
namespace, with its own address on a veth pair to a bridge in the root namespace.

    root ns:  bridge BR (10.X.0.1/24) ── veth ─┬─ ns head  (10.X.0.2)  GCS, raylet, the run's driver
                                                ├─ ns node1 (10.X.0.3)  raylet
                                                └─ ns node2 (10.X.0.4)  raylet

Everything between nodes crosses the veths: an engine actor on node1 serves its wire RPCs at
10.X.0.3, so the rollout actor on the head reaches it over the head's and node1's veths. The
filesystem is shared (one machine), as the Ray runtime requires of a run directory.

Each node advertises role resources (runtime/ray_nodes.py) so the run's actors land where a
test expects them: `venusrl_trainer` on the head; room for one engine (`venusrl_engine: 1`)
and `venusrl_sandbox` on the others. A node is killed by SIGKILL of every process in its namespace (raylet,
its workers, their children), and cut off by setting its root-side veth down.

`NamespacedCluster.start` raises `Unavailable` (the fixture skips, naming it) where namespaces,
veths or a bridge cannot be made; `close` removes what was made, also after a failed start.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY_PORT = 6379
_instances = itertools.count()
START_TIMEOUT_S = 120.0
# Dead nodes are declared after period x threshold without a health check answer (Ray's
# default is 5 x 3 s); shorter here so a killed node's loss reaches the run sooner.
HEAD_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5",
            "RAY_health_check_timeout_ms": "1000"}
# Ray 2.5x+ turns token authentication on by default; these test clusters live inside
# namespaces of this machine, and their drivers would each need the token.
CLUSTER_ENV = {"RAY_AUTH_MODE": "disabled"}


class Unavailable(Exception):
    """A capability the cluster needs is missing on this machine."""


@dataclass
class Node:
    name: str  # network namespace
    ip: str
    root_veth: str  # its peer in the root namespace, on the bridge
    resources: dict[str, float]
    num_cpus: int
    process: subprocess.Popen | None = None

    def exec_prefix(self) -> list[str]:
        # nsenter, not `ip netns exec`: that remounts /sys for the namespace, hiding
        # /sys/fs/cgroup from the sandbox node agents
        return ["nsenter", f"--net=/var/run/netns/{self.name}"]


@dataclass
class NamespacedCluster:
    workdir: Path
    tag: str = field(default_factory=lambda: f"v{os.getpid() % 10000}{next(_instances)}")  # unique names
    nodes: list[Node] = field(default_factory=list)
    bridge: str = ""
    made_namespaces: list[str] = field(default_factory=list)

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{RAY_PORT}"

    def start(self, workers: int = 2, roles: list[tuple[dict[str, float], int]] | None = None) -> None:
        """The head and `workers` nodes; `roles`: each node's (resources, CPUs), head first
        (default: the head the trainer's node, the workers engine and sandbox nodes)."""
        self.cgroups_before = set(_run_cgroups())
        subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        self.bridge = f"{self.tag}br"
        _ip_or_unavailable("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        roles = roles or [({"venusrl_trainer": 1.0}, 2)] + [({"venusrl_engine": 1.0, "venusrl_sandbox": 8.0}, 1)] * workers
        for index, (resources, num_cpus) in enumerate(roles):
            node = Node(f"{self.tag}n{index}", f"{subnet}.{index + 2}", f"{self.tag}v{index}", resources, num_cpus)
            self.nodes.append(node)  # first: `close` removes what a failed `_make_namespace` made
            self._make_namespace(node)
        temp_dir = tempfile.mkdtemp(prefix="vrlray-")  # short: Ray's unix socket paths must fit 107 bytes
        self.ray_temp = Path(temp_dir)
        self._start_ray(self.head, head=True)
        self.wait_for_nodes(1)
        for count, node in enumerate(self.nodes[1:], start=2):
            # one at a time: raylets starting together on one filesystem pick the same socket names
            self._start_ray(node, head=False)
            self.wait_for_nodes(count)

    def _make_namespace(self, node: Node) -> None:
        _ip_or_unavailable("netns", "add", node.name)
        self.made_namespaces.append(node.name)
        inner = f"{node.root_veth}i"
        _ip("link", "add", node.root_veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", node.name)
        _ip("link", "set", node.root_veth, "master", self.bridge)
        _ip("link", "set", node.root_veth, "up")
        inside = ["ip", "netns", "exec", node.name, "ip"]
        _run([*inside, "link", "set", "lo", "up"])
        _run([*inside, "link", "set", inner, "name", "eth0"])
        _run([*inside, "addr", "add", f"{node.ip}/24", "dev", "eth0"])
        _run([*inside, "link", "set", "eth0", "up"])

    def _start_ray(self, node: Node, head: bool) -> None:
        ray = str(Path(sys.executable).parent / "ray")
        command = [*node.exec_prefix(), ray, "start", "--block", "--disable-usage-stats",
                   f"--node-ip-address={node.ip}", f"--num-cpus={node.num_cpus}", "--num-gpus=0",
                   f"--resources={json.dumps(node.resources)}", f"--object-store-memory={100 * 2**20}"]
        if head:
            command += ["--head", f"--port={RAY_PORT}", "--include-dashboard=false", f"--temp-dir={self.ray_temp}"]
        else:
            command += [f"--address={self.address}"]
        log = open(self.workdir / f"ray-{node.name}.log", "w")  # noqa: SIM115 - the process's lifetime
        env = {**os.environ, **CLUSTER_ENV, **(HEAD_ENV if head else {}), "PYTHONPATH": _pythonpath()}
        node.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)

    def wait_for_nodes(self, count: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until `count` nodes are alive in the cluster (asked from the head's namespace)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process is not None and node.process.poll() is not None:
                    raise RuntimeError(f"ray on {node.name} exited with {node.process.returncode}: "
                                       f"{(self.workdir / f'ray-{node.name}.log').read_text()[-3000:]}")
            if self.alive_nodes() >= count:
                return
            time.sleep(0.5)  # polling the cluster's state, not waiting for something to happen
        raise TimeoutError(f"fewer than {count} Ray nodes alive after {timeout_s:.0f} s: {self.last_probe_error}")

    def alive_nodes(self) -> int:
        script = ("import ray; ray.init(log_to_driver=False); "
                  "print(sum(n['Alive'] for n in ray.nodes()))")
        result = self.run_in_head([sys.executable, "-c", script], timeout=60, check=False)
        lines = result.stdout.strip().splitlines()
        self.last_probe_error = result.stderr[-2000:]
        return int(lines[-1]) if result.returncode == 0 and lines and lines[-1].isdigit() else 0

    def run_in_head(self, command: list[str], timeout: float, check: bool = True,
                    env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`command` in the head node's namespace, joined to the cluster (RAY_ADDRESS)."""
        return subprocess.run([*self.head.exec_prefix(), *command], capture_output=True, text=True,
                              timeout=timeout, check=check, env=self.head_env(env))

    def head_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **CLUSTER_ENV, "RAY_ADDRESS": self.address, "PYTHONPATH": _pythonpath(), **(extra or {})}

    def popen_in_head(self, command: list[str], log: Path) -> subprocess.Popen:
        out = open(log, "w")  # noqa: SIM115 - the process's lifetime
        return subprocess.Popen([*self.head.exec_prefix(), *command], stdout=out, stderr=subprocess.STDOUT,
                                env=self.head_env())

    def pids(self, node: Node) -> list[int]:
        listed = _run(["ip", "netns", "pids", node.name], check=False).stdout.split()
        return [int(pid) for pid in listed]

    def kill(self, node: Node) -> int:
        """SIGKILL every process in the node's namespace (its raylet, workers and their
        children); how many there were."""
        pids = self.pids(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if node.process is not None:
            node.process.wait(timeout=30)
        return len(pids)

    def revive(self, node: Node) -> None:
        """Start a killed node's Ray again (a new Ray node at the same address) and wait until
        the cluster counts every node alive."""
        self._start_ray(node, head=False)
        self.wait_for_nodes(len(self.nodes))

    def set_link(self, node: Node, up: bool) -> None:
        """Cut (or restore) the node's link to the others: its veth on the bridge down (up)."""
        _ip("link", "set", node.root_veth, "up" if up else "down")

    def veth_bytes(self, node: Node) -> int:
        """Bytes through the node's root-side veth, both ways."""
        stats = Path("/sys/class/net") / node.root_veth / "statistics"
        return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())

    def close(self) -> None:
        """Kill every node's processes, remove namespaces, veths, bridge and Ray's temp dir;
        whatever part of the start got done."""
        for node in self.nodes:
            if node.name in self.made_namespaces:
                self.kill(node)
        for node in self.nodes:  # both ends at once (a namespace's own go only once nothing is left in it)
            _run(["ip", "link", "del", node.root_veth], check=False)
        for name in self.made_namespaces:
            _run(["ip", "netns", "del", name], check=False)
        if self.bridge:
            _run(["ip", "link", "del", self.bridge], check=False)
        if getattr(self, "ray_temp", None) is not None:
            shutil.rmtree(self.ray_temp, ignore_errors=True)
        # a killed node's agent could not remove its (now empty) cgroups: this machine is its host
        for root in set(_run_cgroups()) - getattr(self, "cgroups_before", set()):
            for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()


def _run_cgroups() -> list[Path]:
    """The sandbox runs' cgroup roots on this machine (sandbox/cgroups.py names them venusrl-*)."""
    return list(Path("/sys/fs/cgroup").glob("*/venusrl-*")) + list(Path("/sys/fs/cgroup").glob("venusrl-*"))


def _pythonpath() -> str:
    """The checkout's src/ and root (tests/), so every node's workers import this venusrl."""
    root = Path(__file__).resolve().parents[2]
    return os.pathsep.join(p for p in (str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")) if p)


def _run(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _ip_or_unavailable(*args: str) -> None:
    """The first of its kind: a failure here means the capability is missing, not a bug."""
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            raise Unavailable(f"cannot create network namespaces: the `{tool}` command ({package}) is missing")
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        what = "network namespaces" if args[0] == "netns" else "a bridge and veth pairs"
        raise Unavailable(f"cannot create {what}: {result.stderr.strip()}")
