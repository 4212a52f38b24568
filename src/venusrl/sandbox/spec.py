"""What a zygote needs to turn a fork into one sandbox; sent as JSON with the channel fd."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Owner on disk of every template layer and sandbox layer. No sandbox runs as it: each runs
# as its own leased uid (subuid.py) and sees these files as its own through an idmapped
# mount (idmap.py), so layers stay valid across restarts and migrations.
SANDBOX_UID = 100000


@dataclass(frozen=True)
class SandboxSpec:
    sandbox_id: str
    cgroup_procs: tuple[str, ...]  # cgroup.procs files the sandbox joins before unsharing
    root: str  # empty host directory the sandbox's tmpfs root is mounted on
    lower: str  # template layer(s), read-only: one directory, or several joined by ":" (topmost first)
    upper: str  # this sandbox's writable layer
    work: str  # overlayfs work directory
    tmp: str  # host directory bound to /tmp
    read_only_binds: tuple[str, ...]  # host paths visible read-only at the same path
    run_setup: bool  # True when the template was not set up in the zygote (no page sharing)
    uid: int  # this sandbox's own host uid (and gid), leased for its lifetime
    disk_quota: int = 0  # bytes of its private filesystem (upper, work, /tmp); 0: none
    inode_quota: int = 0
    open_files: int = 1024
    session_cwd: str = "/workspace"
    session_env: dict[str, str] = field(default_factory=dict)
    image: dict[str, Any] | None = None  # image/rootfs.py ImageRoot: the root is the image's, not the host's
    zygote_pid: int | None = None  # host pid of the image zygote whose forks join this sandbox (its warm Python)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxSpec:
        data = dict(data)
        data["cgroup_procs"] = tuple(data["cgroup_procs"])
        data["read_only_binds"] = tuple(data["read_only_binds"])
        return cls(**data)
