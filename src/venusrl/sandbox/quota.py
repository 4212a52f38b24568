"""Disk and inode quotas: a directory that is a private, size-limited filesystem.

`make_quota_dir(path, size, inodes)` mounts at `path` a fresh ext4 filesystem of `size`
bytes and at least `inodes` inodes, kept in a sparse image file next to it. A sandbox's
writable layer (overlay upper, work and /tmp) lives there, so writing past the quota fails
inside the sandbox with ENOSPC and can never fill the host's disk: the host pays at most
`size` bytes, and only for blocks actually written.

Why this and not another limit:
- tmpfs `size=`/`nr_inodes=` limits memory, not disk: its pages are charged to the
  sandbox's memory cgroup, so a large checkout would count as memory growth in admission
  (Algorithm 1) and could not be written back to disk under pressure.
- Project quotas (XFS `prjquota`, ext4 `project`) would share one filesystem per node, but
  need the host filesystem mounted with them and a kernel with quota formats built in; this
  machine's kernel has neither (no CONFIG_QFMT_V2, no CONFIG_XFS_QUOTA), and many hosts lack
  the mount option.
- A loop-mounted ext4 needs only the loop and ext4 drivers, limits bytes and inodes exactly,
  and isolates filesystem metadata too: one sandbox's full disk is nobody else's.
The filesystem has no journal: a sandbox's layer does not outlive its node agent, so crash
consistency buys nothing, and the journal would cost writes and space. No resize inode
either: a sandbox's filesystem never grows.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from venusrl.sandbox import linux

INODE_BYTES = 256  # ext4 inode size: room for nanosecond and post-2038 timestamps
BLOCK_BYTES = 4096


@dataclass(frozen=True)
class QuotaDir:
    path: Path  # the mount point: everything below it counts against the quota
    image: Path  # the sparse image file behind it
    size: int
    inodes: int

    def usage(self) -> dict[str, int]:
        st = os.statvfs(self.path)
        return {"disk_used_bytes": (st.f_blocks - st.f_bfree) * st.f_frsize,
                "disk_quota_bytes": st.f_blocks * st.f_frsize,
                "inodes_used": st.f_files - st.f_ffree, "inode_quota": st.f_files}

    def remove(self) -> None:
        """Detach the filesystem (the kernel frees it once no namespace holds it) and
        delete its image; safe to call twice."""
        try:
            linux.umount(str(self.path), linux.MNT_DETACH)
        except OSError as err:
            if err.errno not in (errno.EINVAL, errno.ENOENT):  # not mounted (any more), or gone
                raise
        self.image.unlink(missing_ok=True)


def make_quota_dir(path: Path, size: int, inodes: int, image: Path | None = None,
                   blanks: Path | None = None) -> QuotaDir:
    """Mount a new, empty filesystem of `size` bytes and at least `inodes` inodes at `path`
    (created if missing; must be empty). Raises ValueError naming the limit mkfs refused.
    With `blanks`, a directory of formatted empty images, one per (size, inodes), is kept
    there and copied (sparsely: a few hundred KiB) instead of running mkfs every time."""
    image = image or path.with_name(path.name + ".img")
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise ValueError(f"quota directory {path} is not empty")
    quota = QuotaDir(path, image, size, inodes)
    try:
        if blanks is None:
            _format(image, size, inodes)
        else:
            _run(["cp", "--sparse=always", str(_blank(blanks, size, inodes)), str(image)], f"copy to {image}", OSError)
        # noinit_itable: no background zeroing of inode tables (it would write them all to
        # the image); the group descriptors' checksums say which inodes were never used.
        _run(["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime,noinit_itable", str(image), str(path)],
             f"mount of {image}", OSError)
    except BaseException:
        quota.remove()
        raise
    return quota


def _format(image: Path, size: int, inodes: int) -> None:
    with open(image, "wb") as f:
        f.truncate(size)  # sparse: host blocks are used only as the sandbox writes
    _run(["mkfs.ext4", "-q", "-F", "-b", str(BLOCK_BYTES), "-I", str(INODE_BYTES), "-N", str(inodes),
          "-m", "0", "-O", "^has_journal,^resize_inode", "-E", "nodiscard,lazy_itable_init=1", str(image)],
         f"disk_quota={size} bytes with inode_quota={inodes}", ValueError)


def _blank(blanks: Path, size: int, inodes: int) -> Path:
    """The formatted empty image for (size, inodes), made once. Concurrent makers race
    harmlessly: each formats its own temporary file and the first to link it in place wins;
    a published image is never replaced, since another sandbox may be copying it (`cp`
    refuses a source replaced while it copies: a rename over it failed a sandbox's start)."""
    blank = blanks / f"ext4-{size}-{inodes}.img"
    if not blank.exists():
        blanks.mkdir(parents=True, exist_ok=True)
        partial = blanks / f".{blank.name}.{os.getpid()}.{threading.get_ident()}"
        try:
            _format(partial, size, inodes)
            with contextlib.suppress(FileExistsError):  # another maker published first: keep its image
                os.link(partial, blank)
        finally:
            partial.unlink(missing_ok=True)
    return blank


def release_mounts_under(path: Path) -> int:
    """Detach every mount at or below `path`, deepest first: the quota filesystems a dead
    node agent could not unmount. Returns how many were detached."""
    base = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        points = [_unescape(line.split()[4]) for line in f]
    inside = [p for p in points if p == base or p.startswith(base.rstrip("/") + "/")]
    for point in sorted(set(inside), key=len, reverse=True):
        try:
            linux.umount(point, linux.MNT_DETACH)
        except OSError as err:
            if err.errno != errno.EINVAL:  # already detached with its parent
                raise
    return len(set(inside))


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def _run(argv: list[str], what: str, error: type[Exception]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True)
    except FileNotFoundError:
        raise OSError(f"{what}: {argv[0]} is not installed (Debian: e2fsprogs, mount; `make system-deps`)") from None
    if done.returncode != 0:
        raise error(f"{what}: {argv[0]} failed ({done.stderr.strip() or done.returncode})")


class SpareQuotaDirs:
    """Quota directories made ahead, off the create path: per (size, inodes) in use, up to
    `keep` mounted, empty filesystems wait under `spare_dir`. `take` moves one into place
    with a rename (a mount moves with its parent directory) and has another made by
    `submit` (a background executor); with none ready it makes one on the spot."""

    def __init__(self, spare_dir: Path, blanks: Path, submit: Callable[..., object], keep: int = 2) -> None:
        self.spare_dir = spare_dir
        self.blanks = blanks
        self.submit = submit
        self.keep = keep
        self._ready: dict[tuple[int, int], list[Path]] = {}
        self._pending: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def take(self, base: Path, size: int, inodes: int) -> QuotaDir:
        """A quota directory at `base`/layer (image `base`/layer.img); `base` must not exist."""
        key = (size, inodes)
        with self._lock:
            ready = self._ready.setdefault(key, [])
            spare = ready.pop() if ready else None
            wanted = self.keep - len(ready) - self._pending.get(key, 0)
            self._pending[key] = self._pending.get(key, 0) + max(0, wanted)
        for _ in range(max(0, wanted)):
            self.submit(self._make_spare, key)
        if spare is None:
            return make_quota_dir(base / "layer", size, inodes, blanks=self.blanks)
        base.parent.mkdir(parents=True, exist_ok=True)
        os.rename(spare, base)
        return QuotaDir(base / "layer", base / "layer.img", size, inodes)

    def _make_spare(self, key: tuple[int, int]) -> None:
        spare = self.spare_dir / uuid.uuid4().hex
        try:
            make_quota_dir(spare / "layer", *key, blanks=self.blanks)
        except (OSError, ValueError):
            spare = None  # take() makes one on the spot and reports the error there
        with self._lock:
            self._pending[key] -= 1
            if spare is not None and not self._closed:
                self._ready[key].append(spare)
                spare = None
        if spare is not None:
            _discard(spare)

    def close(self) -> None:
        """Unmount and delete the spares; call after the executor has finished its work."""
        with self._lock:
            self._closed = True
            spares = [p for ready in self._ready.values() for p in ready]
            self._ready.clear()
        for spare in spares:
            _discard(spare)


def _discard(spare: Path) -> None:
    QuotaDir(spare / "layer", spare / "layer.img", 0, 0).remove()
    shutil.rmtree(spare, ignore_errors=True)
