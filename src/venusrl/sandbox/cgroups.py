"""Memory, pids and freezer cgroups for sandboxes, on cgroup v1 or v2.

A `Cgroup` is one relative path (e.g. `venusrl-ab12/node-0/sb-3f`) that exists in every
controller the layout needs: on v1 the `memory`, `pids` and `freezer` hierarchies, on v2
one directory of the unified hierarchy with `memory` and `pids` enabled by its ancestors.
Node cgroups hold the node budget with the kernel OOM killer held off (v1
`memory.oom_control`, v2 `memory.high`); sandbox cgroups hold the declared size and a
pids limit with the OOM killer active, so a sandbox past its own size loses only its
largest process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "freezer")


@dataclass(frozen=True)
class CgroupLayout:
    version: int  # 1 or 2
    root: Path  # v1: the directory holding one mount per controller; v2: the unified mount

    def dirs(self, rel: str) -> list[Path]:
        if self.version == 1:
            return [self.root / c / rel for c in V1_CONTROLLERS]
        return [self.root / rel]

    def controller_dir(self, controller: str, rel: str) -> Path:
        return self.root / controller / rel if self.version == 1 else self.root / rel


def detect_layout(root: Path = CGROUP_ROOT) -> CgroupLayout:
    """v1 when a memory hierarchy is mounted under root, else v2 where it offers memory."""
    if all((root / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
        return CgroupLayout(1, root)
    for unified in (root, root / "unified"):
        controllers = unified / "cgroup.controllers"
        if controllers.exists() and {"memory", "pids"} <= set(controllers.read_text().split()):
            return CgroupLayout(2, unified)
    raise RuntimeError(
        f"no usable cgroup hierarchy under {root}: need v1 {'/'.join(V1_CONTROLLERS)} "
        "or v2 with the memory and pids controllers"
    )


class Cgroup:
    """One cgroup across the controllers of `layout`; every method is a few file writes."""

    def __init__(self, layout: CgroupLayout, rel: str) -> None:
        self.layout = layout
        self.rel = rel.strip("/")
        if not self.rel or ".." in self.rel.split("/"):
            # kill_all on the root cgroup would SIGKILL every process on the host
            raise ValueError(f"cgroup path {rel!r} must name a cgroup below the root")

    def child(self, name: str) -> Cgroup:
        return Cgroup(self.layout, f"{self.rel}/{name}")

    def _file(self, controller: str, name: str) -> Path:
        return self.layout.controller_dir(controller, self.rel) / name

    def _write(self, controller: str, name: str, value: str) -> None:
        self._file(controller, name).write_text(value)

    def _read(self, controller: str, name: str) -> str:
        return self._file(controller, name).read_text()

    # lifecycle -----------------------------------------------------------------------
    def create(self) -> Cgroup:
        if self.layout.version == 2:
            self._enable_v2_controllers()
        for d in self.layout.dirs(self.rel):
            d.mkdir(parents=True, exist_ok=True)
        return self

    def _enable_v2_controllers(self) -> None:
        # A v2 cgroup gets memory/pids files only when every ancestor delegates them.
        parts = self.rel.split("/")
        for depth in range(len(parts)):
            parent = self.layout.root.joinpath(*parts[:depth])
            parent.mkdir(exist_ok=True)
            control = parent / "cgroup.subtree_control"
            if not {"memory", "pids"} <= set(control.read_text().split()):
                control.write_text("+memory +pids")

    def exists(self) -> bool:
        return self.layout.dirs(self.rel)[0].exists()

    def pids(self) -> list[int]:
        try:
            text = self._read("memory", "cgroup.procs")
        except FileNotFoundError:
            return []
        return [int(p) for p in text.split()]

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL every process in this cgroup and its children; waits until they are gone."""
        deadline = time.monotonic() + timeout
        kill_file = self._file("memory", "cgroup.kill")
        while True:
            pids = self.tree_pids()
            if not pids:
                return
            if self.layout.version == 2 and kill_file.exists():
                kill_file.write_text("1")
            else:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            # A frozen task dies only once thawed.
            self.thaw_tree()
            if time.monotonic() > deadline:
                raise TimeoutError(f"cgroup {self.rel}: processes {pids} survive SIGKILL")
            time.sleep(0.01)

    def tree_pids(self) -> list[int]:
        found: list[int] = []
        for cg in self.walk():
            found.extend(cg.pids())
        return found

    def walk(self) -> list[Cgroup]:
        """This cgroup and all descendants, parents before children."""
        base = self.layout.controller_dir("memory", self.rel)
        if not base.exists():
            return []
        out = [self]
        for dirpath, dirnames, _ in os.walk(base):
            for name in sorted(dirnames):
                rel = os.path.relpath(os.path.join(dirpath, name), self.layout.controller_dir("memory", ""))
                out.append(Cgroup(self.layout, rel))
        return out

    def remove(self) -> None:
        """Kill what is left and remove this cgroup with its descendants, in every controller."""
        if not self.exists():
            return
        self.kill_all()
        for cg in reversed(self.walk()):
            for d in cg.layout.dirs(cg.rel):
                for _ in range(100):
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:  # EBUSY while the kernel finishes tearing down tasks
                        time.sleep(0.01)

    def remove_parent_if_empty(self) -> None:
        parent = self.rel.rpartition("/")[0]
        if not parent:
            return
        for d in self.layout.dirs(parent):
            with contextlib.suppress(OSError):  # not empty (other nodes) or already gone
                d.rmdir()

    # limits ----------------------------------------------------------------------------
    def set_memory_limit(self, limit: int) -> None:
        if self.layout.version == 1:
            self._write("memory", "memory.limit_in_bytes", str(limit))
        else:
            self._write("memory", "memory.max", str(limit))

    def set_pids_limit(self, limit: int) -> None:
        self._write("pids", "pids.max", str(limit))

    def hold_oom(self, limit: int) -> None:
        """Cap the subtree at `limit` and keep the kernel OOM killer off it: tasks past it
        wait (v1) or are throttled (v2) until the agent frees memory."""
        if self.layout.version == 1:
            self._write("memory", "memory.limit_in_bytes", str(limit))
            self._write("memory", "memory.oom_control", "1")
        else:
            self._write("memory", "memory.high", str(limit))
            # The hard cap leaves room for the agent to react before the kernel would kill.
            self._write("memory", "memory.max", str(limit + limit // 8))

    def release_oom(self) -> None:
        """Let the kernel OOM killer act on this cgroup: the last resort for a node, the
        rule for a sandbox (v1 children inherit `oom_control` from their parent, so a
        sandbox under a node that holds OOM off must turn it back on)."""
        if self.layout.version == 1:
            self._write("memory", "memory.oom_control", "0")

    # measurements ----------------------------------------------------------------------
    def memory_usage(self) -> int:
        name = "memory.usage_in_bytes" if self.layout.version == 1 else "memory.current"
        return int(self._read("memory", name))

    def memory_stat(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in self._read("memory", "memory.stat").splitlines():
            key, _, value = line.partition(" ")
            out[key] = int(value)
        return out

    def working_set(self) -> int:
        """Usage less inactive file cache: the memory the kernel could not reclaim."""
        stat = self.memory_stat()
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        return max(0, self.memory_usage() - inactive)

    def oom_kills(self) -> int:
        """OOM kills in this cgroup's subtree since it was created."""
        if self.layout.version == 2:
            return _field(self._read("memory", "memory.events"), "oom_kill")
        total = 0
        for cg in self.walk():
            try:
                total += _field(cg._read("memory", "memory.oom_control"), "oom_kill")
            except OSError:  # a sandbox's cgroup removed while the subtree was walked
                continue
        return total

    def memory_events(self) -> dict[str, int]:
        text = self._read("memory", "memory.events" if self.layout.version == 2 else "memory.oom_control")
        return {k: int(v) for k, v in (line.split() for line in text.splitlines())}

    def pids_events_max(self) -> int:
        """How many forks the pids limit refused."""
        try:
            return _field(self._read("pids", "pids.events"), "max")
        except FileNotFoundError:
            return 0

    # freezer ---------------------------------------------------------------------------
    def freeze(self) -> None:
        if self.layout.version == 1:
            self._write("freezer", "freezer.state", "FROZEN")
        else:
            self._write("memory", "cgroup.freeze", "1")

    def thaw(self) -> None:
        if self.layout.version == 1:
            self._write("freezer", "freezer.state", "THAWED")
        else:
            self._write("memory", "cgroup.freeze", "0")

    def thaw_tree(self) -> None:
        for cg in self.walk():
            with contextlib.suppress(FileNotFoundError):
                cg.thaw()

    def frozen(self) -> bool:
        if self.layout.version == 1:
            return self._read("freezer", "freezer.state").strip() != "THAWED"
        return self._read("memory", "cgroup.freeze").strip() == "1"


def _field(text: str, key: str) -> int:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return 0


class OomWatcher:
    """Signals memory pressure on a node cgroup: v1 an eventfd on `memory.oom_control`,
    v2 a rise of the `high` or `max` counters of `memory.events` (polled)."""

    def __init__(self, cgroup: Cgroup) -> None:
        self.cgroup = cgroup
        self._efd = -1
        self._control = -1
        self._last = 0
        if cgroup.layout.version == 1:
            self._efd = os.eventfd(0, os.EFD_CLOEXEC)
            control = cgroup._file("memory", "memory.oom_control")
            self._control = os.open(control, os.O_RDONLY | os.O_CLOEXEC)
            cgroup._write("memory", "cgroup.event_control", f"{self._efd} {self._control}")
        else:
            self._last = self._v2_count()

    def _v2_count(self) -> int:
        events = self.cgroup.memory_events()
        return events.get("high", 0) + events.get("max", 0)

    def wait(self, timeout: float) -> bool:
        """True when pressure was signalled within `timeout` seconds."""
        if self._efd >= 0:
            ready, _, _ = select.select([self._efd], [], [], timeout)
            if ready:
                os.eventfd_read(self._efd)
                return True
            return False
        time.sleep(timeout)
        count = self._v2_count()
        fired = count > self._last
        self._last = count
        return fired

    def under_oom(self) -> bool:
        if self.cgroup.layout.version == 1:
            return self.cgroup.memory_events().get("under_oom", 0) == 1
        return False

    def close(self) -> None:
        for fd in (self._efd, self._control):
            if fd >= 0:
                os.close(fd)
        self._efd = self._control = -1
