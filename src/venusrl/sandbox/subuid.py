"""Host uids for sandboxes: each live sandbox runs as its own uid, leased host-wide.

Per-uid kernel state (the user keyring, inotify and user-namespace counts, RLIMIT_NPROC)
is shared by every process of a uid, so two sandboxes must never run as the same one.
The uids come from the subordinate-id range of the `venusrl` user in /etc/subuid (the
convention rootless containers use), or from DEFAULT_RANGE where it has none.

Leases are host-wide, not per node agent: several node agents (and test runs) share one
host. A lease is an exclusive `flock` on `<lease_dir>/<uid>`; the kernel drops it when the
holder's process dies, so a crashed agent leaks no uid. The lock file is unlinked on release
while still locked, and a lock counts only if the path still names the locked inode (else a
release and a new lease could both believe they hold the uid).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from venusrl.sandbox.errors import AdmissionRefused

SUBUID_USER = "venusrl"
LEASE_DIR = Path("/run/venusrl/uids")


@dataclass(frozen=True)
class UidRange:
    start: int
    count: int

    def __post_init__(self) -> None:
        if self.start <= 0 or self.count <= 0 or self.start + self.count > (1 << 32) - 1:
            raise ValueError(f"uid range {self.start}:{self.count} must lie in 1..2^32-2")

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.start <= uid < self.start + self.count


DEFAULT_RANGE = UidRange(1_000_000, 65536)


def subuid_range(path: Path = Path("/etc/subuid"), user: str = SUBUID_USER) -> UidRange:
    """The first `user:start:count` line of `path`, else DEFAULT_RANGE."""
    with contextlib.suppress(FileNotFoundError):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            name, _, rest = line.strip().partition(":")
            if name != user:
                continue
            start, _, count = rest.partition(":")
            try:
                return UidRange(int(start), int(count))
            except ValueError as err:
                raise ValueError(f"{path}:{number}: {line!r} is not {user}:START:COUNT ({err})") from None
    return DEFAULT_RANGE


def probe_order(uids: UidRange, cursor: int) -> Iterator[int]:
    """Every uid of the range once, starting at `cursor` and wrapping: a released uid is
    reused last, so whatever a sandbox left behind in per-uid state ages before reuse."""
    offset = (cursor - uids.start) % uids.count
    for i in range(uids.count):
        yield uids.start + (offset + i) % uids.count


@dataclass
class UidLease:
    uid: int
    path: Path
    fd: int

    def release(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still locked: see the module docstring
        os.close(self.fd)
        self.fd = -1


class UidAllocator:
    """Leases uids of `uids` for one process; thread-safe. `reserved` uids are never leased."""

    def __init__(self, uids: UidRange, lease_dir: Path = LEASE_DIR, reserved: frozenset[int] = frozenset()) -> None:
        self.uids = uids
        self.lease_dir = lease_dir
        self.reserved = reserved
        self._cursor = uids.start
        self._lock = threading.Lock()

    def acquire(self) -> UidLease:
        self.lease_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._lock:
            for uid in probe_order(self.uids, self._cursor):
                if uid in self.reserved:
                    continue
                lease = self._try(uid)
                if lease is not None:
                    self._cursor = uid + 1
                    return lease
        raise AdmissionRefused(
            f"no free sandbox uid: all {self.uids.count} uids from {self.uids.start} are leased "
            f"(see {self.lease_dir}; a larger range goes in /etc/subuid as {SUBUID_USER}:START:COUNT)"
        )

    def _try(self, uid: int) -> UidLease | None:
        path = self.lease_dir / str(uid)
        for _ in range(3):  # a release may unlink the file between our open and our lock
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            if _same_file(path, fd):
                return UidLease(uid, path, fd)
            os.close(fd)
        return None


def _same_file(path: Path, fd: int) -> bool:
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)
