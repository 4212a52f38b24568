"""The Ray runtime's sandbox cluster: the counterpart of `LocalCluster` with each node
agent hosted by a Ray actor, spread over the cluster's nodes.

A node agent only listens on loopback, so the controller never connects to it directly:
`NodeAgentActor` starts `python -m venusrl.sandbox.node_server` (TCP on 127.0.0.1) on its
Ray node and relays calls and the event stream to it; `RayNodeClient` gives the controller
the `NodeClient` interface on top of the actor. When an actor dies its agent's stdin
closes and the agent removes its cgroups and sandboxes, as under `LocalCluster`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from venusrl.runtime.ray_nodes import role_options
from venusrl.sandbox.cgroups import Cgroup, detect_layout
from venusrl.sandbox.cluster import (
    ask_node_to_stop,
    node_settings,
    start_node_process,
    wait_for_node,
)
from venusrl.sandbox.config import SandboxConfig
from venusrl.sandbox.controller import SandboxController
from venusrl.sandbox.errors import SandboxError, SandboxUnavailable
from venusrl.sandbox.node_client import NodeClient

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
EVENT_POLL_S = 1.0
CALL_THREADS = 128  # every in-flight sandbox call (a command can run for minutes) holds one


class NodeAgentActor:
    """One node agent process on this actor's Ray node, and a loopback client of it."""

    def __init__(self, node_id: str, budget: int, config: SandboxConfig, token: str, cgroup: str) -> None:
        self._own_workdir = config.workdir is None
        self.workdir = Path(config.workdir or tempfile.mkdtemp(prefix="vrl-"))
        os.chmod(self.workdir, 0o700)
        self.settings = node_settings(config, node_id, "tcp:127.0.0.1:0", token, budget, cgroup, self.workdir / node_id)
        self.process, self.address = start_node_process(self.settings)
        self.client = NodeClient(node_id, self.address, token, call_grace_s=config.oom_grace_s + 30.0)
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.client.watch(self.events.put, lambda: self.events.put(None))

    def info(self) -> dict[str, Any]:
        return {"node_id": self.settings.node_id, "address": self.address, "pid": self.process.pid,
                "host": ray.util.get_node_ip_address()}

    def call(self, op: str, wait_s: float, fields: dict[str, Any]) -> tuple[bool, Any]:
        """(True, result), or (False, the SandboxError the agent reported): returned rather
        than raised, so the caller gets the sandbox error itself and not Ray's wrapper."""
        try:
            return True, self.client.call(op, wait_s=wait_s, **fields)
        except SandboxError as err:
            return False, err

    def next_events(self, timeout_s: float) -> list[dict[str, Any]] | None:
        """The agent's events since the last call (waiting up to `timeout_s` for one), or
        None once its event stream has ended."""
        try:
            batch = [self.events.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        while not self.events.empty():
            batch.append(self.events.get_nowait())
        return None if None in batch else batch

    def stop(self) -> None:
        """Shut the agent down (it removes its sandboxes), then its cgroup and workdir."""
        ask_node_to_stop(self.process)
        wait_for_node(self.process)
        cgroup = Cgroup(detect_layout(), self.settings.cgroup)
        cgroup.remove()
        cgroup.remove_parent_if_empty()  # the run's root on this host, once its last agent is gone
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class RayNodeClient:
    """`NodeClient`'s interface for the controller, over a `NodeAgentActor`."""

    def __init__(self, node_id: str, actor: Any, call_grace_s: float) -> None:
        self.node_id = node_id
        self.actor = actor
        self.call_grace_s = call_grace_s
        self._watching = threading.Event()

    def call(self, op: str, wait_s: float = 60.0, **fields: Any) -> Any:
        try:
            ok, value = ray.get(self.actor.call.remote(op, wait_s, fields), timeout=wait_s + self.call_grace_s)
        except RayError as err:  # the actor died, or the call outlived its wait
            raise SandboxUnavailable(f"node {self.node_id}: {op} failed ({type(err).__name__})") from None
        if not ok:
            raise value
        return value

    def watch(self, on_event: Callable[[dict[str, Any]], None], on_lost: Callable[[], None]) -> threading.Thread:
        """Relay the node's events on a thread; `on_lost` runs once when the stream ends, the
        actor dies or watching stops."""
        self._watching.set()

        def loop() -> None:
            try:
                while self._watching.is_set():
                    batch = ray.get(self.actor.next_events.remote(EVENT_POLL_S))
                    if batch is None:
                        break
                    for event in batch:
                        on_event(event)
            except RayError:
                pass
            finally:
                on_lost()

        thread = threading.Thread(target=loop, name=f"watch-{self.node_id}", daemon=True)
        thread.start()
        return thread

    def stop_watching(self) -> None:
        self._watching.clear()


class RayCluster:
    """`config.nodes` node agent actors, spread over the Ray cluster, and a controller
    connected to them. Create it inside the process that uses the controller."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.cgroup_root = f"venusrl-{uuid.uuid4().hex[:8]}"
        token = secrets.token_hex(32)
        agent_class = ray.remote(NodeAgentActor).options(max_concurrency=CALL_THREADS, scheduling_strategy="SPREAD",
                                                         **role_options("sandbox"))
        self.actors = {f"node-{i}": agent_class.remote(f"node-{i}", int(config.node_memory), config, token,
                                                       f"{self.cgroup_root}/node-{i}")
                       for i in range(config.nodes)}
        try:
            for info in ray.get([actor.info.remote() for actor in self.actors.values()], timeout=START_TIMEOUT_S):
                log.info("sandbox node agent %s on %s (pid %d) at %s", info["node_id"], info["host"], info["pid"],
                         info["address"])
            clients = [RayNodeClient(node_id, actor, config.oom_grace_s + 30.0) for node_id, actor in self.actors.items()]
            self.controller = SandboxController(clients, on_node_lost=self._stop_node)
        except BaseException:
            self.close()
            raise

    def _stop_node(self, node_id: str) -> None:
        """The agent is gone; its actor (when alive) removes what the agent left behind."""
        with contextlib.suppress(RayError):
            ray.get(self.actors[node_id].stop.remote(), timeout=60)

    def close(self) -> None:
        controller = getattr(self, "controller", None)
        if controller is not None:
            controller.close()
        stops = [actor.stop.remote() for actor in self.actors.values()]
        with contextlib.suppress(RayError):
            ray.get(stops, timeout=60)
        for actor in self.actors.values():
            ray.kill(actor)
