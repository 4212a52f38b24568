"""The cluster controller: the sandbox pool over node agents.

Placement tries nodes in `rank_nodes` order (group affinity, then headroom) and
redirects on refusal. Calls follow a sandbox when it migrates: a call in flight on the
old node gets SandboxMigrated and is re-issued where the sandbox now lives, so the
original caller receives the result. OOM on a node runs Algorithm 1's loop (lines 16-25)
here. When a node agent dies, its sandboxes are recreated elsewhere from their last saved
state (session from the last call, files from the layer directory when this host can
read it) and calls to them raise the retryable SandboxUnavailable meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from venusrl.sandbox import admission
from venusrl.sandbox.errors import (
    AdmissionRefused,
    CapacityError,
    InvalidRequest,
    SandboxError,
    SandboxMigrated,
    SandboxNotFound,
    SandboxUnavailable,
)
from venusrl.sandbox.layer import Layer
from venusrl.sandbox.node_client import NodeClient
from venusrl.sandbox.placement import NodeView, choose_migration, rank_nodes
from venusrl.sandbox.template import DEFAULT_TEMPLATE, Template

log = logging.getLogger(__name__)

FOLLOW_MOVES = 8  # a call re-issued after this many migrations in a row gives up


@dataclass
class Route:
    """Where a sandbox lives and what it would take to recreate it."""

    sandbox_id: str
    node_id: str
    template: Template
    group_id: str | None
    memory_limit: int | None
    session: dict[str, Any]
    layer: str
    lost: str | None = None  # why it could not be recovered


@dataclass
class MigrationRecord:
    sandbox_id: str
    source: str
    target: str
    seconds: float
    bytes: int


@dataclass
class OomRecord:
    node_id: str
    seconds: float  # from interception to thaw
    migrations: list[MigrationRecord] = field(default_factory=list)


class SandboxController:
    def __init__(self, nodes: list[NodeClient], on_node_lost: Callable[[str], None] | None = None) -> None:
        if not nodes:
            raise InvalidRequest("nodes: the controller needs at least one node agent")
        self.nodes = {n.node_id: n for n in nodes}
        self.alive = {n.node_id: True for n in nodes}
        self.templates: dict[str, Template] = {DEFAULT_TEMPLATE.name: DEFAULT_TEMPLATE}
        self.routes: dict[str, Route] = {}
        self.oom_records: list[OomRecord] = []
        self.recoveries: list[str] = []
        self._lock = threading.RLock()
        self._closing = False
        self._on_node_lost = on_node_lost
        for node in nodes:
            node.watch(lambda event, n=node.node_id: self._on_event(n, event), lambda n=node.node_id: self._lost(n))

    @classmethod
    def attach(cls, info_path: Path) -> SandboxController:
        """Connect to node agents started by `venusrl sandbox serve` (its --info file)."""
        import json

        info = json.loads(Path(info_path).read_text())
        return cls([NodeClient(node_id, address, info["token"]) for node_id, address in info["nodes"].items()])

    # templates and placement --------------------------------------------------------------
    def register_template(self, template: Template) -> None:
        with self._lock:
            known = self.templates.get(template.name)
            if known is not None and known != template:
                raise InvalidRequest(f"template: {template.name!r} is already registered with a different setup")
            self.templates[template.name] = template

    def _template(self, template: str | Template) -> Template:
        if isinstance(template, Template):
            self.register_template(template)
            return template
        found = self.templates.get(template)
        if found is None:
            raise InvalidRequest(f"template: unknown template {template!r} (known: {', '.join(sorted(self.templates))})")
        return found

    def node_views(self, exclude: str | None = None) -> list[NodeView]:
        views = []
        for node_id, client in self.nodes.items():
            if not self.alive[node_id] or node_id == exclude:
                continue
            try:
                status = client.call("status", wait_s=10.0)
            except SandboxUnavailable:
                continue
            views.append(NodeView(node_id, True, status["m_total"], status["m_used"], status["threshold"],
                                  frozenset(status["groups"])))
        return views

    def create(self, template: str | Template = DEFAULT_TEMPLATE.name, group_id: str | None = None,
               memory_limit: int | None = None, sandbox_id: str | None = None, node_id: str | None = None) -> str:
        """Place a new sandbox (on `node_id` only, when given); raises CapacityError
        (retryable) when every node refuses."""
        spec = self._template(template)
        if memory_limit is not None and (not isinstance(memory_limit, int) or memory_limit <= 0):
            raise InvalidRequest(f"memory_limit: expected a positive number of bytes, got {memory_limit!r}")
        sandbox_id = sandbox_id or uuid.uuid4().hex[:16]
        if node_id is not None and node_id not in self.nodes:
            raise InvalidRequest(f"node_id: unknown node {node_id!r} (known: {', '.join(self.nodes)})")
        refusals = []
        order = [node_id] if node_id is not None else rank_nodes(self.node_views(), group_id)
        for node_id in order:
            try:
                created = self.nodes[node_id].call(
                    "create", wait_s=180.0, sandbox_id=sandbox_id, template=spec.model_dump(mode="json"),
                    group_id=group_id, memory_limit=memory_limit)
            except (AdmissionRefused, SandboxUnavailable) as err:
                refusals.append(str(err))
                continue
            with self._lock:
                self.routes[sandbox_id] = Route(sandbox_id, node_id, spec, group_id, memory_limit,
                                                created["session"], created["layer"])
            return sandbox_id
        raise CapacityError("no node admits the sandbox now: " + ("; ".join(refusals) or "no live node"))

    # calls that follow the sandbox ------------------------------------------------------------
    def _route(self, sandbox_id: str) -> Route:
        with self._lock:
            route = self.routes.get(sandbox_id)
        if route is None:
            raise SandboxNotFound(f"sandbox_id: no sandbox {sandbox_id!r}")
        if route.lost:
            raise SandboxUnavailable(f"sandbox {sandbox_id} was lost: {route.lost}")
        if not self.alive[route.node_id]:
            raise SandboxUnavailable(f"sandbox {sandbox_id}: node {route.node_id} is down; recovery in progress")
        return route

    def _call(self, sandbox_id: str, op: str, wait_s: float = 60.0, **fields: Any) -> Any:
        for _ in range(FOLLOW_MOVES):
            node_id = self._route(sandbox_id).node_id  # a copy: migration mutates the route
            try:
                return self.nodes[node_id].call(op, wait_s=wait_s, sandbox_id=sandbox_id, **fields)
            except SandboxMigrated:
                self._wait_for_move(sandbox_id, node_id)
        raise SandboxUnavailable(f"sandbox {sandbox_id}: moved {FOLLOW_MOVES} times during one call")

    def _wait_for_move(self, sandbox_id: str, old_node: str, timeout: float = 30.0) -> None:
        # The route changes before the old node releases the sandbox; this only covers a
        # migration that a different controller thread is still finishing.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            route = self.routes.get(sandbox_id)
            if route is None or route.node_id != old_node:
                return
            time.sleep(0.01)

    def run(self, sandbox_id: str, cmd: str, timeout: float = 60.0, cwd: str | None = None,
            env: dict[str, str] | None = None) -> dict[str, Any]:
        result = self._call(sandbox_id, "run", wait_s=timeout, timeout=timeout, cmd=cmd, cwd=cwd, env=env or {})
        with self._lock:
            route = self.routes.get(sandbox_id)
            if route is not None:
                route.session = {"cwd": result["cwd"], "env": result["env"]}
        return result

    def read(self, sandbox_id: str, path: str) -> dict[str, Any]:
        return self._call(sandbox_id, "read", path=path)

    def write(self, sandbox_id: str, path: str, data: str) -> dict[str, Any]:
        return self._call(sandbox_id, "write", path=path, data=data)

    def list(self, sandbox_id: str, path: str) -> list[dict[str, Any]]:
        return self._call(sandbox_id, "list", path=path)

    def envd(self, sandbox_id: str, op: str, **fields: Any) -> Any:
        """A process-table or filesystem operation in the sandbox (sandbox/envd_request.py
        lists them): what the E2B service's envd endpoints run."""
        return self._call(sandbox_id, op, **fields)

    def pause(self, sandbox_id: str) -> None:
        self._call(sandbox_id, "pause")

    def resume(self, sandbox_id: str) -> None:
        self._call(sandbox_id, "resume")

    def metrics(self, sandbox_id: str) -> dict[str, Any]:
        return {**self._call(sandbox_id, "metrics"), "node_id": self.routes[sandbox_id].node_id}

    def kill(self, sandbox_id: str) -> None:
        self._call(sandbox_id, "kill")
        with self._lock:
            self.routes.pop(sandbox_id, None)

    # OOM: Algorithm 1, lines 12-26 ------------------------------------------------------------
    def _on_event(self, node_id: str, event: dict[str, Any]) -> None:
        if event.get("event") == "oom":
            threading.Thread(target=self.resolve_oom, args=(node_id,), name=f"oom-{node_id}", daemon=True).start()

    def resolve_oom(self, node_id: str) -> OomRecord:
        """The node froze its sandboxes; move the largest away until it is safe, then thaw."""
        started = time.monotonic()
        record = OomRecord(node_id, 0.0)
        source = self.nodes[node_id]
        try:
            while True:
                status = source.call("status", wait_s=10.0)
                # While the kernel still holds a task waiting for memory, the node is not safe
                # whatever the growth estimate says.
                if not status["under_oom"] and admission.safe_after_oom(
                        status["m_total"], status["m_used"], status["g_active"], status["alpha"], status["min_headroom"]):
                    break
                candidates = [(s["sandbox_id"], float(s["bytes"])) for s in status["sandboxes"]]
                choice = choose_migration(candidates, self.node_views(exclude=node_id))
                if choice is None:
                    log.warning("node %s: OOM and no node can take its largest sandbox", node_id)
                    source.call("oom_fallback", wait_s=10.0)
                    break
                record.migrations.append(self.migrate(choice[0], choice[1]))
        except SandboxError as err:
            log.warning("node %s: OOM resolution stopped: %s", node_id, err)
        finally:
            try:
                source.call("oom_done", wait_s=10.0)
            except SandboxError as err:
                log.warning("node %s: could not thaw after OOM: %s", node_id, err)
        record.seconds = time.monotonic() - started
        self.oom_records.append(record)
        log.info("node %s: OOM resolved in %.2fs with %d migrations", node_id, record.seconds, len(record.migrations))
        return record

    def migrate(self, sandbox_id: str, target: str) -> MigrationRecord:
        """Move a sandbox's files and shell session to `target`. A command in flight is
        moved as the files it started from and re-run there by the call waiting for it, so
        its effects apply once (flight.py); if the target refuses, the source keeps it."""
        started = time.monotonic()
        route = self._route(sandbox_id)
        source = route.node_id
        state = self.nodes[source].call("export", wait_s=120.0, sandbox_id=sandbox_id)
        try:
            created = self.nodes[target].call(
                "create", wait_s=180.0, sandbox_id=sandbox_id, template=state["template"], group_id=state["group_id"],
                memory_limit=state["memory_limit"],
                state={"session": state["session"], "layer": state["layer"], "bytes": state["bytes"]})
        except BaseException:
            self.nodes[source].call("export_abort", wait_s=10.0, sandbox_id=sandbox_id)
            raise
        with self._lock:
            route.node_id, route.session, route.layer = target, created["session"], created["layer"]
        self.nodes[source].call("release", wait_s=60.0, sandbox_id=sandbox_id, to=target)
        record = MigrationRecord(sandbox_id, source, target, time.monotonic() - started, int(state["bytes"]))
        log.info("sandbox %s migrated %s -> %s in %.2fs (%d MiB)", sandbox_id, source, target, record.seconds, record.bytes >> 20)
        return record

    # node loss -------------------------------------------------------------------------------
    def _lost(self, node_id: str) -> None:
        if self._closing or not self.alive[node_id]:
            return
        self.alive[node_id] = False
        log.info("node %s lost; recovering its sandboxes", node_id)
        if self._on_node_lost is not None:
            self._on_node_lost(node_id)
        with self._lock:
            orphans = [r for r in self.routes.values() if r.node_id == node_id]
        for route in orphans:
            self._recover(route)

    def _recover(self, route: Route) -> None:
        layer_dir = Path(route.layer)
        state: dict[str, Any] = {"session": route.session, "bytes": 0}
        if layer_dir.is_dir():  # same host (embedded runtime): the files survive the agent
            import base64

            state["layer"] = base64.b64encode(Layer(layer_dir).archive(at_command_start=True)).decode()
        for node_id in rank_nodes(self.node_views(), route.group_id):
            try:
                created = self.nodes[node_id].call(
                    "create", wait_s=180.0, sandbox_id=route.sandbox_id, template=route.template.model_dump(mode="json"),
                    group_id=route.group_id, memory_limit=route.memory_limit, state=state)
            except (AdmissionRefused, SandboxUnavailable):
                continue
            with self._lock:
                route.node_id, route.layer = node_id, created["layer"]
            self.recoveries.append(route.sandbox_id)
            log.info("sandbox %s recovered on node %s", route.sandbox_id, node_id)
            return
        route.lost = "no live node admitted it"
        log.warning("sandbox %s could not be recovered", route.sandbox_id)

    def close(self) -> None:
        self._closing = True
        for node in self.nodes.values():
            node.stop_watching()
