"""The node agent: runs one node's sandboxes, measures their memory every control interval,
admits by Algorithm 1, and intercepts OOM on the node cgroup.

On OOM the agent freezes every sandbox and tells the controller (over the `watch` stream);
the controller migrates the largest sandbox away, asks for a fresh status, repeats until
`safe_after_oom`, and ends with `oom_done`, which thaws. If nobody resolves it within
`oom_grace_s`, the agent thaws and hands the node back to the kernel OOM killer.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO

from venusrl.sandbox import admission, envd_request, protocol
from venusrl.sandbox.backends.process import ProcessBackend, SandboxProcess
from venusrl.sandbox.cgroups import Cgroup, OomWatcher, detect_layout
from venusrl.sandbox.config import SandboxConfig
from venusrl.sandbox.errors import (
    AdmissionRefused,
    InvalidRequest,
    SandboxMigrated,
    SandboxNotFound,
    SandboxUnavailable,
    TemplateError,
)
from venusrl.sandbox.flight import CommandFence
from venusrl.sandbox.profiles import ColdStartProfiles
from venusrl.sandbox.template import Template

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeSettings:
    """What one node agent is told: who it is (identity, address, budget, cgroup) and the
    `sandbox` section of the config it runs under, as is."""

    node_id: str
    address: str  # unix:/path or tcp:127.0.0.1:port
    token: str
    budget: int
    cgroup: str  # relative cgroup path of the node
    workdir: str
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def to_json(self) -> str:
        return json.dumps({**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "sandbox"},
                           "sandbox": self.sandbox.model_dump(mode="json")})

    @classmethod
    def from_json(cls, text: str) -> NodeSettings:
        data = json.loads(text)
        return cls(**{**data, "sandbox": SandboxConfig.model_validate(data.get("sandbox", {}))})


@dataclass
class _Tracked:
    """Memory history of one sandbox (or a reservation for one being created)."""

    key: str  # profile key
    started_at: float
    cold_start_bytes: float
    samples: deque
    observed: bool = False
    ready: bool = False  # False while being created: its whole cold start is still ahead


class NodeAgent:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.workdir = Path(settings.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        layout = detect_layout()
        self.cgroup = Cgroup(layout, settings.cgroup).create()
        self.cgroup.hold_oom(settings.budget)
        self.backend = ProcessBackend(self.cgroup, self.workdir, settings.sandbox.share_pages, settings.sandbox.pids_limit,
                                      settings.sandbox.image_store, settings.node_id)
        self.profiles_path = self.workdir / "profiles.json"
        self.profiles = ColdStartProfiles.load(self.profiles_path)
        self._tracked: dict[str, _Tracked] = {}
        self._gone: dict[str, Exception] = {}  # why a sandbox left: migrated or killed
        self._fences: dict[str, CommandFence] = {}  # one per live sandbox
        self._lock = threading.RLock()
        self._admit_lock = threading.Lock()
        self._watchers: list[BinaryIO] = []
        self.oom_active = False
        self._oom_since = 0.0
        self.oom_events = 0
        self._released = False  # the kernel OOM killer is the node's last resort right now
        self._stop = threading.Event()
        self._watcher = OomWatcher(self.cgroup)
        self._threads = [
            threading.Thread(target=self._control_loop, name="control", daemon=True),
            threading.Thread(target=self._oom_loop, name="oom", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        log.info("node %s up: budget %d MiB, cgroup v%d %s, admission=%s, share_pages=%s",
                 settings.node_id, settings.budget >> 20, layout.version, settings.cgroup,
                 settings.sandbox.admission, settings.sandbox.share_pages)

    # measurements ----------------------------------------------------------------------
    def _control_loop(self) -> None:
        while not self._stop.wait(self.settings.sandbox.control_interval_s):
            try:
                self.sample(time.monotonic())
            except Exception:  # noqa: BLE001 - a failed sample must not stop the loop
                log.exception("node %s: sampling failed", self.settings.node_id)

    def sample(self, now: float) -> None:
        window = self.settings.sandbox.growth_window_s
        with self._lock:
            sandboxes = self.backend.all()
        learned = False
        for sandbox in sandboxes:
            tracked = self._tracked.get(sandbox.sandbox_id)
            if tracked is None or not tracked.ready:
                continue
            try:
                used = sandbox.cgroup.memory_usage()
            except FileNotFoundError:
                continue
            tracked.samples.append((now, used))
            while tracked.samples and tracked.samples[0][0] < now - window:
                tracked.samples.popleft()
            if not tracked.observed and now - tracked.started_at >= self.settings.sandbox.cold_start_s:
                self.profiles.observe(tracked.key, used)
                tracked.observed = learned = True
        if learned:
            self.profiles.save(self.profiles_path)
        if self.oom_active and now - self._oom_since > self.settings.sandbox.oom_grace_s:
            self.fall_back_to_kernel(f"unresolved after {self.settings.sandbox.oom_grace_s:.0f}s")
        if self._released and self.m_used() < 0.9 * self.settings.budget:
            self.cgroup.hold_oom(self.settings.budget)
            self._released = False
            log.info("node %s: pressure gone, OOM killer held off again", self.settings.node_id)

    def m_used(self) -> int:
        return self.cgroup.working_set()

    def g_active(self, now: float) -> float:
        with self._lock:
            tracked = list(self._tracked.values())
        views = [admission.SandboxMemory(tuple(t.samples), t.started_at if t.ready else now, t.cold_start_bytes,
                                         self.settings.sandbox.cold_start_s)
                 for t in tracked]
        return admission.estimate_active_growth(views, now, self.settings.sandbox.growth_window_s, self.settings.sandbox.reaction_time_s)

    def decide(self, key: str, memory_limit: int, candidate_bytes: float | None, now: float) -> admission.AdmissionDecision:
        if self.settings.sandbox.admission == "declared":
            with self._lock:
                declared = sum(s.memory_limit for s in self.backend.all())
                declared += sum(1 for sid in self._tracked if sid not in self.backend.sandboxes) * int(self.settings.sandbox.memory_limit)
            return admission.decide_declared(self.settings.budget, declared, memory_limit)
        g_candidate = candidate_bytes if candidate_bytes is not None else self.profiles.estimate(key, self._unprofiled(memory_limit))
        return admission.decide(self.settings.budget, self.m_used(), self.g_active(now), g_candidate,
                                self.settings.sandbox.alpha, self.settings.sandbox.min_headroom)

    def _unprofiled(self, memory_limit: int) -> float:
        default = self.settings.sandbox.cold_start_default
        return memory_limit if default is None else min(default, memory_limit)

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        g_active = self.g_active(now)
        m_used = self.m_used()
        budget = self.settings.budget
        threshold = 1.0 - max(self.settings.sandbox.alpha * g_active, self.settings.sandbox.min_headroom * budget) / budget
        with self._lock:
            sandboxes = [{"sandbox_id": s.sandbox_id, "template": s.template.name, "group_id": s.group_id,
                          "bytes": s.cgroup.memory_usage() if s.cgroup.exists() else 0,
                          "memory_limit": s.memory_limit, "layer": str(s.layer.base)}
                         for s in self.backend.all()]
        return {"node_id": self.settings.node_id, "m_total": self.settings.budget, "m_used": m_used,
                "g_active": g_active, "threshold": threshold, "sandboxes": sandboxes,
                "groups": sorted({s["group_id"] for s in sandboxes if s["group_id"]}),
                "oom_active": self.oom_active, "oom_events": self.oom_events, "under_oom": self.under_oom(m_used),
                "oom_kills": self.cgroup.oom_kills(), "alpha": self.settings.sandbox.alpha,
                "min_headroom": self.settings.sandbox.min_headroom}

    # OOM ---------------------------------------------------------------------------------
    def under_oom(self, m_used: int) -> bool:
        """Tasks are waiting for memory: v1 reports it; on v2, usage sits at the budget."""
        return self._watcher.under_oom() or m_used >= self.settings.budget * 0.99

    def _oom_loop(self) -> None:
        while not self._stop.is_set():
            if self._watcher.wait(0.5) and not self._stop.is_set():
                self.intercept_oom()

    def intercept_oom(self) -> None:
        with self._lock:
            if self.oom_active:
                return
            self.oom_active = True
            self._oom_since = time.monotonic()
            self.oom_events += 1
            for sandbox in self.backend.all():
                sandbox.cgroup.freeze()
        log.info("node %s: OOM intercepted at %d MiB; %d sandboxes frozen", self.settings.node_id,
                 self.cgroup.memory_usage() >> 20, len(self.backend.sandboxes))
        if not self._broadcast({"event": "oom", "node_id": self.settings.node_id}):
            self.fall_back_to_kernel("no controller is watching")

    def fall_back_to_kernel(self, why: str) -> None:
        """No migration can relieve the node: let the kernel OOM killer act, then thaw."""
        log.warning("node %s: OOM %s; handing it to the kernel OOM killer", self.settings.node_id, why)
        self.cgroup.release_oom()
        self._released = True
        self.finish_oom()

    def finish_oom(self) -> None:
        with self._lock:
            for sandbox in self.backend.all():
                if not sandbox.paused:
                    sandbox.cgroup.thaw()
            was = self.oom_active
            self.oom_active = False
        if was:
            log.info("node %s: OOM resolved, sandboxes thawed, %d MiB used", self.settings.node_id, self.m_used() >> 20)

    def _broadcast(self, event: dict[str, Any]) -> bool:
        delivered = False
        with self._lock:
            for stream in list(self._watchers):
                try:
                    protocol.send(stream, event)
                    delivered = True
                except OSError:
                    self._watchers.remove(stream)
        return delivered

    def add_watcher(self, stream: BinaryIO) -> None:
        with self._lock:
            self._watchers.append(stream)

    def remove_watcher(self, stream: BinaryIO) -> None:
        with self._lock:
            if stream in self._watchers:
                self._watchers.remove(stream)

    # operations ------------------------------------------------------------------------
    def create(self, request: dict[str, Any]) -> dict[str, Any]:
        sandbox_id = _sandbox_id(request)
        template = _template(request)
        memory_limit = _positive_int(request, "memory_limit", int(self.settings.sandbox.memory_limit))
        group_id = request.get("group_id")
        if group_id is not None and not isinstance(group_id, str):
            raise InvalidRequest(f"group_id: expected a string or null, got {group_id!r}")
        state = request.get("state")
        key = ColdStartProfiles.key(template.name, self.settings.sandbox.share_pages)
        now = time.monotonic()
        with self._admit_lock:
            candidate = float(state["bytes"]) if state and "bytes" in state else None
            decision = self.decide(key, memory_limit, candidate, now)
            if not decision.admit:
                raise AdmissionRefused(f"node {self.settings.node_id}: {decision.reason}")
            with self._lock:
                if sandbox_id in self.backend.sandboxes or sandbox_id in self._tracked:
                    raise InvalidRequest(f"sandbox_id: {sandbox_id!r} already exists on node {self.settings.node_id}")
                # Reserved from now on: the next decision counts its cold start.
                cold = candidate if candidate is not None else self.profiles.estimate(key, self._unprofiled(memory_limit))
                self._tracked[sandbox_id] = _Tracked(key, now, cold, deque(), observed=candidate is not None)
        try:
            archive = base64.b64decode(state["layer"]) if state and state.get("layer") else None
            sandbox = self.backend.create(sandbox_id, template, group_id, memory_limit,
                                          session=(state or {}).get("session"), layer_archive=archive)
            self._start_image_command(sandbox)
        except BaseException:
            with self._lock:
                self._tracked.pop(sandbox_id, None)
            raise
        self._gone.pop(sandbox_id, None)
        with self._lock:
            self._fences[sandbox_id] = CommandFence(sandbox_id)
            tracked = self._tracked.get(sandbox_id)
            if tracked is not None:  # its cold start is measured from when it is ready
                tracked.started_at, tracked.ready = time.monotonic(), True
        log.info("node %s: sandbox %s created (template %s, group %s, %s)", self.settings.node_id, sandbox_id,
                 template.name, group_id, "restored" if state else decision.reason)
        return {"sandbox_id": sandbox_id, "node_id": self.settings.node_id, "session": sandbox.session,
                "layer": str(sandbox.layer.base)}

    def _start_image_command(self, sandbox: SandboxProcess) -> None:
        """Entrypoint+Cmd, in every incarnation of the sandbox: background processes do not
        survive a move or a recovery, so the target starts them again."""
        command = self.backend.images.start_command(sandbox.template)
        if command is None:
            return
        try:
            started = self.backend.run(sandbox, {"op": "run", "cmd": command, "timeout": 30.0, "cwd": None, "env": {}})
        except BaseException:
            self.backend.destroy(sandbox.sandbox_id)
            raise
        if started["exit_code"] != 0:
            self.backend.destroy(sandbox.sandbox_id)
            raise TemplateError(f"template {sandbox.template.name}: image command did not start: {started['stderr'][-300:]}")

    def _sandbox(self, request: dict[str, Any]) -> SandboxProcess:
        sandbox_id = _string(request, "sandbox_id")
        with self._lock:
            sandbox = self.backend.sandboxes.get(sandbox_id)
            if sandbox is None:
                reason = self._gone.get(sandbox_id)
                if reason is not None:
                    raise type(reason)(str(reason))
                raise SandboxNotFound(f"sandbox_id: no sandbox {sandbox_id!r} on node {self.settings.node_id}")
        return sandbox

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        sandbox = self._sandbox(request)
        cmd = _string(request, "cmd")
        timeout = request.get("timeout", 60.0)
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise InvalidRequest(f"timeout: expected a positive number of seconds, got {timeout!r}")
        cwd = request.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise InvalidRequest(f"cwd: expected a string, got {cwd!r}")
        env = request.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise InvalidRequest(f"env: expected a mapping of strings to strings, got {env!r}")
        call = {"op": "run", "cmd": cmd, "timeout": float(timeout), "cwd": cwd, "env": env}
        layer = sandbox.layer
        once = self.settings.sandbox.exactly_once
        with self._fence(sandbox).command(layer.snapshot if once else None, layer.drop_snapshot if once else None):
            return self._forward(sandbox, lambda: self.backend.run(sandbox, call, frozen=self._frozen))

    def _fence(self, sandbox: SandboxProcess) -> CommandFence:
        with self._lock:
            fence = self._fences.get(sandbox.sandbox_id)
        if fence is None:
            raise SandboxNotFound(f"sandbox_id: no sandbox {sandbox.sandbox_id!r} on node {self.settings.node_id}")
        return fence

    def _frozen(self, sandbox: SandboxProcess) -> bool:
        return self.oom_active or sandbox.paused

    def files(self, request: dict[str, Any]) -> Any:
        sandbox = self._sandbox(request)
        op = request["op"]
        call = {"op": op, "path": _string(request, "path")}
        if op != "write":
            return self._forward(sandbox, lambda: self.backend.files(sandbox, call, frozen=self._frozen))
        call["data"] = _string(request, "data")
        with self._fence(sandbox).command(None, None):  # a write lands before an export or after the move
            return self._forward(sandbox, lambda: self.backend.files(sandbox, call, frozen=self._frozen))

    def envd(self, request: dict[str, Any]) -> Any:
        """A process-table or filesystem operation (envd_request.py) on a sandbox's init."""
        sandbox = self._sandbox(request)
        call = envd_request.checked(request)
        return self._forward(sandbox, lambda: self.backend.files(sandbox, call, frozen=self._frozen))

    def _forward(self, sandbox: SandboxProcess, send: Callable[[], Any]) -> Any:
        try:
            return send()
        except SandboxUnavailable:
            self._recover_local(sandbox)
            raise

    def _recover_local(self, sandbox: SandboxProcess) -> None:
        """The init died under a call. If the sandbox left on purpose, say where it went;
        otherwise restart it over its layer and last session, and let the caller retry."""
        with self._lock:
            reason = self._gone.get(sandbox.sandbox_id)
        if reason is not None:
            raise type(reason)(str(reason))
        log.info("node %s: sandbox %s crashed, restarting from its layer", self.settings.node_id, sandbox.sandbox_id)
        sandbox.cgroup.kill_all()
        if self.settings.sandbox.exactly_once and sandbox.layer.restore_snapshot():
            log.info("node %s: sandbox %s: files restored to the interrupted command's start",
                     self.settings.node_id, sandbox.sandbox_id)
        self.backend.start(sandbox)

    def pause(self, request: dict[str, Any]) -> None:
        self.backend.pause(self._sandbox(request))

    def resume(self, request: dict[str, Any]) -> None:
        sandbox = self._sandbox(request)
        sandbox.paused = False
        if not self.oom_active:
            self.backend.resume(sandbox)

    def metrics(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._sandbox(request).metrics()

    def kill(self, request: dict[str, Any]) -> None:
        sandbox_id = self._sandbox(request).sandbox_id
        self._remove(sandbox_id, SandboxNotFound(f"sandbox_id: sandbox {sandbox_id!r} was killed"))
        log.info("node %s: sandbox %s killed", self.settings.node_id, sandbox_id)

    def export(self, request: dict[str, Any]) -> dict[str, Any]:
        """The sandbox's state for a move; until `release` or `export_abort`, no command
        starts and none in flight delivers its result (flight.py)."""
        sandbox = self._sandbox(request)
        fence = self._fence(sandbox)
        in_flight = fence.begin_export()
        try:
            state = self.backend.export(sandbox)
            if in_flight and self.settings.sandbox.exactly_once:
                state["layer"] = base64.b64encode(sandbox.layer.archive(at_command_start=True)).decode()
            state["bytes"] = sandbox.cgroup.memory_usage()
        except BaseException:
            fence.end_export(None)
            raise
        state["in_flight_from_snapshot"] = in_flight and self.settings.sandbox.exactly_once
        return state

    def export_abort(self, request: dict[str, Any]) -> None:
        self._fence(self._sandbox(request)).end_export(None)

    def release(self, request: dict[str, Any]) -> None:
        """The sandbox now lives on `to`: drop it here; its in-flight call learns it moved."""
        sandbox = self._sandbox(request)
        sandbox_id = sandbox.sandbox_id
        to = _string(request, "to")
        self._fence(sandbox).end_export(to)
        self._remove(sandbox_id, SandboxMigrated(f"sandbox {sandbox_id} migrated to node {to}"))
        log.info("node %s: sandbox %s released after migration to %s", self.settings.node_id, sandbox_id, to)

    def _remove(self, sandbox_id: str, reason: Exception) -> None:
        with self._lock:
            self._gone[sandbox_id] = reason
            while len(self._gone) > 4096:
                self._gone.pop(next(iter(self._gone)))
            self._tracked.pop(sandbox_id, None)
            self._fences.pop(sandbox_id, None)
        self.backend.destroy(sandbox_id)

    def dispatch(self, request: dict[str, Any]) -> Any:
        op = request.get("op")
        handlers = {
            "create": self.create, "run": self.run, "read": self.files, "write": self.files, "list": self.files,
            "pause": self.pause, "resume": self.resume, "kill": self.kill, "metrics": self.metrics,
            "export": self.export, "export_abort": self.export_abort, "release": self.release,
            "status": lambda _r: self.status(),
            "oom_done": lambda _r: self.finish_oom(),
            "oom_fallback": lambda _r: self.fall_back_to_kernel("cannot be relieved by migration"),
            "intercept_oom": lambda _r: self.intercept_oom(),
            **{op: self.envd for op in envd_request.OPS},
        }
        handler = handlers.get(op)  # type: ignore[arg-type]
        if handler is None:
            raise InvalidRequest(f"op: unknown operation {op!r} (known: {', '.join(sorted(handlers))})")
        return handler(request)

    def shutdown(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self.backend.shutdown()
        self._watcher.close()
        self.cgroup.remove()
        self.cgroup.remove_parent_if_empty()  # the run's root, once its last node is gone
        log.info("node %s: shut down", self.settings.node_id)


_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def _sandbox_id(request: dict[str, Any]) -> str:
    value = _string(request, "sandbox_id")
    if not _SANDBOX_ID.match(value):
        raise InvalidRequest(f"sandbox_id: expected 1-64 letters, digits, '-' or '_', got {value!r}")
    return value


def _string(request: dict[str, Any], field: str) -> str:
    value = request.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{field}: expected a non-empty string, got {value!r}")
    return value


def _positive_int(request: dict[str, Any], field: str, default: int) -> int:
    value = request.get(field)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidRequest(f"{field}: expected a positive integer of bytes, got {value!r}")
    return value


def _template(request: dict[str, Any]) -> Template:
    from pydantic import ValidationError

    raw = request.get("template")
    if not isinstance(raw, dict):
        raise InvalidRequest(f"template: expected a template mapping, got {raw!r}")
    try:
        return Template.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidRequest(f"template.{where}: {first['msg']}") from None
