"""The `process` backend: sandboxes are forks of a template zygote in their own namespaces
and cgroups (see sandbox_init.py). This module is the node-side half: it leases the
sandbox's host uid, prepares its cgroup and its layer on a quota-limited filesystem, asks
the pool to fork it, and talks to its init over the sandbox's channel."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import select
import shutil
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from venusrl.sandbox import forkserver, protocol, seccomp
from venusrl.sandbox.backends.pool import IMAGE_ZYGOTE, TemplatePool
from venusrl.sandbox.cgroups import Cgroup
from venusrl.sandbox.errors import InvalidRequest, SandboxError, SandboxUnavailable, TemplateError
from venusrl.sandbox.image.rootfs import ImageRoot
from venusrl.sandbox.image.templates import ImageTemplates
from venusrl.sandbox.layer import Layer
from venusrl.sandbox.memory import process_memory
from venusrl.sandbox.quota import QuotaDir, SpareQuotaDirs, release_mounts_under
from venusrl.sandbox.spec import SANDBOX_UID, SandboxSpec
from venusrl.sandbox.subuid import UidAllocator, UidLease, subuid_range
from venusrl.sandbox.template import Template

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
CALL_GRACE_S = 10.0  # beyond a command's own timeout before its sandbox counts as hung


def system_read_only_binds() -> tuple[str, ...]:
    """Host paths a sandbox sees read-only: the OS and the Python that runs venusrl."""
    paths = ["/usr", "/etc", sys.base_prefix, sys.prefix]
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths))


@dataclass
class SandboxProcess:
    sandbox_id: str
    template: Template
    group_id: str | None
    memory_limit: int
    cgroup: Cgroup
    layer: Layer
    root: Path
    session: dict[str, Any]
    uid: UidLease  # this sandbox's own host uid, held until it is destroyed
    quota: QuotaDir  # the filesystem its layer lives on
    channel: socket.socket | None = None
    stream: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    paused: bool = False
    in_flight: dict[str, Any] | None = None  # the run request being served, saved for migration
    warm: socket.socket | None = None  # an image template's warm Python (forkserver.py), while it runs

    def call(self, request: dict[str, Any], timeout: float, frozen: Callable[[SandboxProcess], bool] = lambda s: False) -> Any:
        """One request to the sandbox init. A dead init, or one silent for `timeout` plus
        a grace period while not frozen, raises SandboxUnavailable: callers never hang."""
        with self.lock:
            if self.stream is None or self.channel is None:
                raise SandboxUnavailable(f"sandbox {self.sandbox_id} is not running")
            try:
                protocol.send(self.stream, request)
                budget = timeout + CALL_GRACE_S
                while budget > 0:
                    ready, _, _ = select.select([self.channel], [], [], min(1.0, budget))
                    if ready:
                        break
                    if not frozen(self):  # time spent frozen (paused, OOM) does not count
                        budget -= 1.0
                else:
                    raise TimeoutError(f"no reply within {timeout + CALL_GRACE_S:.0f}s")
                reply = protocol.receive(self.stream)
            except (OSError, TimeoutError, ValueError) as err:
                self.disconnect()
                raise SandboxUnavailable(f"sandbox {self.sandbox_id}: init unreachable ({err})") from None
            if reply is None:
                self.disconnect()
                raise SandboxUnavailable(f"sandbox {self.sandbox_id}: init exited")
            return protocol.unwrap(reply, f"sandbox {self.sandbox_id}")

    def disconnect(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.warm is not None:
            self.warm.close()
        self.channel = self.stream = self.warm = None

    def metrics(self) -> dict[str, Any]:
        pids = self.cgroup.pids()
        return {
            "cgroup_bytes": self.cgroup.memory_usage(),
            "working_set_bytes": self.cgroup.working_set(),
            **{f"{k}_bytes": v for k, v in process_memory(pids).items()},
            "processes": len(pids),
            "memory_limit": self.memory_limit,
            "oom_kills": self.cgroup.oom_kills(),
            "pids_refused": self.cgroup.pids_events_max(),
            "paused": self.paused,
            "command_running": self.in_flight is not None,  # a run request is being served (or held by a pause)
            "uid": self.uid.uid,
            **self.quota.usage(),
        }


class ProcessBackend:
    """All sandboxes of one node. Thread-safe: the node agent serves many connections."""

    def __init__(self, node_cgroup: Cgroup, workdir: Path, share_pages: bool, pids_limit: int,
                 image_store: str | Path, node_id: str = "") -> None:
        self.node_cgroup = node_cgroup
        self.workdir = workdir
        self.share_pages = share_pages
        self.pids_limit = pids_limit
        self.sandboxes: dict[str, SandboxProcess] = {}  # mutated only under _sandboxes_lock
        self._sandboxes_lock = threading.Lock()
        self._pools: dict[str, TemplatePool] = {}
        self._pool_lock = threading.Lock()
        self._binds = system_read_only_binds()
        self._uids = UidAllocator(subuid_range(), reserved=frozenset({SANDBOX_UID}))
        stale = sum(release_mounts_under(workdir / d) for d in ("sandboxes", "trash", "spare"))
        if stale:  # left by an agent that died on this workdir
            log.warning("node workdir %s: detached %d quota filesystems of a previous agent", workdir, stale)
        # One background thread makes quota filesystems ahead and tears down destroyed ones.
        self._storage_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-storage")
        self._spares = SpareQuotaDirs(workdir / "spare", workdir / "blank-images", self._storage_worker.submit)
        self.images = ImageTemplates(image_store, f"node {node_id or workdir.name} (workdir {workdir})")

    def pool(self, template: Template) -> TemplatePool:
        with self._pool_lock:
            pool = self._pools.get(template.name)
            if pool is not None and pool.template != template:
                raise InvalidRequest(f"template: {template.name!r} is already defined differently on this node")
            if pool is None or not pool.alive():
                if pool is not None:  # one of its zygotes died: the other goes too (and its cgroup)
                    pool.close()
                    del self._pools[template.name]
                try:
                    pool = self._start_pool(template)
                except BaseException:
                    self.images.release(template)  # the image's hold is the pool's
                    raise
                self._pools[template.name] = pool
            return pool

    def _start_pool(self, template: Template) -> TemplatePool:
        self.images.materialize(template, self.workdir / "templates" / template.name)
        pool = TemplatePool(template, self.node_cgroup.child(f"pool-{template.name}"), self.share_pages)
        job = self.images.image_zygote(template, self.workdir / "templates" / f".{template.name}-zygote")
        if job is not None:
            try:
                pool.warm = TemplatePool(template, self.node_cgroup.child(f"pool-{template.name}-python"),
                                         self.share_pages, module=IMAGE_ZYGOTE,
                                         extra={"image_zygote": job, "cgroups": len(self._cgroup_dirs())})
            except BaseException:
                pool.close()
                raise
        return pool

    def create(self, sandbox_id: str, template: Template, group_id: str | None, memory_limit: int,
               session: dict[str, Any] | None = None, layer_archive: bytes | None = None) -> SandboxProcess:
        if sandbox_id in self.sandboxes:
            raise InvalidRequest(f"sandbox_id: {sandbox_id!r} already exists on this node")
        pool = self.pool(template)
        base = self.workdir / "sandboxes" / sandbox_id
        uid = self._uids.acquire()
        try:
            quota = self._spares.take(base, int(template.disk_quota), template.inode_quota)
        except BaseException as err:
            uid.release()
            if isinstance(err, ValueError):
                raise InvalidRequest(f"template {template.name}: {err}") from None
            raise
        sandbox = SandboxProcess(sandbox_id, template, group_id, memory_limit, self.node_cgroup.child(f"sb-{sandbox_id}"),
                                 Layer(base / "layer"), base / "root", session or {}, uid, quota)
        with self._sandboxes_lock:
            self.sandboxes[sandbox_id] = sandbox
        try:
            sandbox.layer.create()
            if layer_archive is not None:
                sandbox.layer.unpack(layer_archive)
            sandbox.root.mkdir(parents=True, exist_ok=True)
            sandbox.cgroup.create()
            sandbox.cgroup.set_memory_limit(memory_limit)
            sandbox.cgroup.release_oom()  # past its own size a sandbox loses its largest command
            sandbox.cgroup.set_pids_limit(self.pids_limit)
            self.start(sandbox, pool)
        except BaseException:
            self.destroy(sandbox_id)
            raise
        return sandbox

    def start(self, sandbox: SandboxProcess, pool: TemplatePool | None = None) -> None:
        """Fork the sandbox's init from its pool and wait until it serves; also used to
        restart a crashed sandbox over the same layer and last saved session."""
        pool = pool or self.pool(sandbox.template)
        sandbox.layer.reset_work()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        defaults = self.images.session_defaults(sandbox.template)
        spec = SandboxSpec(
            sandbox_id=sandbox.sandbox_id,
            cgroup_procs=tuple(str(d / "cgroup.procs") for d in sandbox.cgroup.layout.dirs(sandbox.cgroup.rel)),
            root=str(sandbox.root),
            lower=str(self.workdir / "templates" / sandbox.template.name),
            upper=str(sandbox.layer.upper),
            work=str(sandbox.layer.work),
            tmp=str(sandbox.layer.tmp),
            read_only_binds=self._binds,
            run_setup=not pool.share_pages,
            uid=sandbox.uid.uid,
            disk_quota=sandbox.quota.size,
            inode_quota=sandbox.quota.inodes,
            session_cwd=sandbox.session.get("cwd", defaults["cwd"]),
            session_env=sandbox.session.get("env", defaults["env"]),
            image=self.images.root(sandbox.template),
            zygote_pid=pool.warm.pid if pool.warm is not None else None,
        )
        try:
            keeper = pool.fork(spec.to_json(), [theirs.fileno()])
        finally:
            theirs.close()
        ours.settimeout(READY_TIMEOUT_S)
        stream = ours.makefile("rwb")
        try:
            ready = protocol.receive(stream)
            ours.settimeout(None)  # from here on, call() bounds every wait with select
        except (OSError, TimeoutError) as err:
            ours.close()
            raise TemplateError(f"sandbox {sandbox.sandbox_id}: init did not report ready ({err})") from None
        if not ready or not ready.get("ready"):
            ours.close()
            raise TemplateError(f"sandbox {sandbox.sandbox_id}: init failed: {(ready or {}).get('error', 'exited')}")
        sandbox.channel, sandbox.stream = ours, stream
        sandbox.session = ready["session"]
        if pool.warm is not None:
            self._start_warm_python(sandbox, pool.warm, keeper, spec)

    def _start_warm_python(self, sandbox: SandboxProcess, warm: TemplatePool, keeper: int, spec: SandboxSpec) -> None:
        """Fork the image zygote into the sandbox (forkserver.join_sandbox): its Python, with
        the template's imports and setup done, joins the init's namespaces and cgroups."""
        helper = _first_child(keeper)  # sandbox_init._fork_in_zygote_namespaces: keeper -> helper -> init
        init = _first_child(helper)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds: list[int] = []
        try:
            fds += [os.open(f"/proc/{init}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name, _ in forkserver.JOIN_ORDER]
            fds += [os.open(procs, os.O_WRONLY | os.O_CLOEXEC) for procs in spec.cgroup_procs]
            root = ImageRoot.from_json(spec.image or {})
            warm.fork({"uid": root.uid, "gid": root.gid, "cwd": root.workdir, "env": spec.session_env,
                       "open_files": spec.open_files, "run_setup": not warm.share_pages,
                       "seccomp": seccomp.packed().hex()}, [theirs.fileno(), *fds])
        finally:
            theirs.close()
            for fd in fds:
                os.close(fd)
        ours.settimeout(READY_TIMEOUT_S)
        try:
            ready = json.loads(ours.makefile("rb").readline() or b"{}")
        except (OSError, TimeoutError, ValueError) as err:
            ready = {"error": str(err)}
        if not ready.get("ready"):
            ours.close()
            raise TemplateError(f"sandbox {sandbox.sandbox_id}: its Python did not start: {ready.get('error', 'exited')}")
        ours.settimeout(None)
        sandbox.warm = ours  # the warm Python lives while this end is open (and the sandbox runs)

    def _cgroup_dirs(self) -> list[Path]:
        """One per hierarchy: what a sandbox joins."""
        return list(self.node_cgroup.layout.dirs(self.node_cgroup.rel))

    def run(self, sandbox: SandboxProcess, request: dict[str, Any],
            frozen: Callable[[SandboxProcess], bool] = lambda s: False) -> dict[str, Any]:
        sandbox.in_flight = request
        try:
            result = sandbox.call(request, float(request["timeout"]), frozen)
        finally:
            sandbox.in_flight = None
        sandbox.session = {"cwd": result["cwd"], "env": result["env"]}
        return result

    def files(self, sandbox: SandboxProcess, request: dict[str, Any],
              frozen: Callable[[SandboxProcess], bool] = lambda s: False) -> Any:
        return sandbox.call(request, 60.0, frozen)

    def pause(self, sandbox: SandboxProcess) -> None:
        sandbox.cgroup.freeze()
        sandbox.paused = True

    def resume(self, sandbox: SandboxProcess) -> None:
        sandbox.cgroup.thaw()
        sandbox.paused = False

    def export(self, sandbox: SandboxProcess) -> dict[str, Any]:
        """Everything needed to recreate the sandbox elsewhere; the sandbox may be frozen."""
        return {
            "sandbox_id": sandbox.sandbox_id,
            "template": sandbox.template.model_dump(mode="json"),
            "group_id": sandbox.group_id,
            "memory_limit": sandbox.memory_limit,
            "session": sandbox.session,
            "in_flight": sandbox.in_flight,
            "layer": base64.b64encode(sandbox.layer.pack()).decode(),
        }

    def all(self) -> list[SandboxProcess]:
        """A snapshot, safe to iterate while other threads create and destroy."""
        with self._sandboxes_lock:
            return list(self.sandboxes.values())

    def destroy(self, sandbox_id: str) -> None:
        with self._sandboxes_lock:
            sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return
        # Killing the init first wakes any call waiting on its channel with EOF; only then
        # can the channel be closed under the call's lock.
        sandbox.cgroup.remove()
        with sandbox.lock:
            sandbox.disconnect()
        sandbox.uid.release()  # only now: no process of the sandbox is left to run as it
        # Unmounting a filesystem and detaching its loop device take tens of ms: done
        # behind the caller's back, from a unique name, so the id may be created again now.
        base = sandbox.root.parent
        trash = self.workdir / "trash" / f"{sandbox_id}-{uuid.uuid4().hex[:8]}"
        trash.parent.mkdir(exist_ok=True)
        os.rename(base, trash)  # the quota filesystem's mount moves with its parent directory
        moved = dataclasses.replace(sandbox.quota, path=trash / sandbox.quota.path.relative_to(base),
                                    image=trash / sandbox.quota.image.relative_to(base))
        self._storage_worker.submit(_remove_storage, sandbox_id, moved, trash)

    def shutdown(self) -> None:
        for sandbox_id in list(self.sandboxes):
            try:
                self.destroy(sandbox_id)
            except SandboxError as err:
                log.warning("sandbox %s: cleanup failed: %s", sandbox_id, err)
        with self._pool_lock:
            for pool in self._pools.values():
                pool.close()
                self.images.release(pool.template)
            self._pools.clear()
        self._storage_worker.shutdown(wait=True)
        self._spares.close()


def _first_child(pid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])


def _remove_storage(sandbox_id: str, quota: QuotaDir, trash: Path) -> None:
    try:
        quota.remove()
        shutil.rmtree(trash)
    except OSError as err:
        log.warning("sandbox %s: leftover storage %s (%s)", sandbox_id, trash, err)
