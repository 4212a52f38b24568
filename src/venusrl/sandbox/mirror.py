"""An incremental copy of a directory tree: `mirror(src, dst)` makes `dst` an exact copy of
`src` (types, modes, owners, times, xattrs, device nodes such as overlayfs whiteouts),
copying only entries that changed since the last call.

A file counts as unchanged when its type, mode, owner, size and mtime equal the copy's,
and its mtime is older than the previous mirror's start by more than the filesystem's
timestamp granularity: a file written in the same clock tick as an earlier copy could
keep its mtime, so recent files are always copied again (git's "racy clean" rule).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

RACY_NS = 100_000_000  # well above ext4's and tmpfs's coarse timestamp tick


def mirror(pairs: list[tuple[Path, Path]], stamp: Path | None) -> int:
    """Make each `dst` a copy of its `src`; `stamp` records when the last mirror began
    (None: copy everything). Returns the number of entries copied."""
    started = time.time_ns()
    try:
        previous = stamp.stat().st_mtime_ns if stamp is not None else 0
    except FileNotFoundError:
        previous = 0
    copied = 0
    for src, dst in pairs:
        dst.mkdir(parents=True, exist_ok=True)
        copied += _sync_dir(src, dst, previous - RACY_NS)
        _copy_metadata(str(src), dst, os.lstat(src))
    if stamp is None:
        return copied
    stamp.touch()
    os.utime(stamp, ns=(started, started))
    return copied


def _sync_dir(src: Path, dst: Path, settled_before_ns: int) -> int:
    copied = 0
    wanted = {entry.name: entry for entry in os.scandir(src)}
    for name in os.listdir(dst):
        if name not in wanted:
            _remove(dst / name)
    for name, entry in wanted.items():
        source = entry.stat(follow_symlinks=False)
        target = dst / name
        try:
            current = os.lstat(target)
        except FileNotFoundError:
            current = None
        if stat.S_ISDIR(source.st_mode):
            if current is not None and not stat.S_ISDIR(current.st_mode):
                _remove(target)
                current = None
            if current is None:
                os.mkdir(target)
                copied += 1
            copied += _sync_dir(Path(entry.path), target, settled_before_ns)
            _copy_metadata(entry.path, target, source)
            continue
        if current is not None and _same(source, current) and source.st_mtime_ns < settled_before_ns:
            continue
        if current is not None:
            _remove(target)
        _copy_entry(entry.path, target, source)
        copied += 1
    return copied


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_mode, a.st_uid, a.st_gid, a.st_size, a.st_mtime_ns, a.st_rdev) == \
        (b.st_mode, b.st_uid, b.st_gid, b.st_size, b.st_mtime_ns, b.st_rdev)


def _copy_entry(path: str, target: Path, source: os.stat_result) -> None:
    mode = source.st_mode
    if stat.S_ISREG(mode):
        shutil.copyfile(path, target)
    elif stat.S_ISLNK(mode):
        os.symlink(os.readlink(path), target)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
        os.mknod(target, mode, source.st_rdev)
    else:  # sockets: nothing a layer needs to keep
        return
    _copy_metadata(path, target, source)


def _copy_metadata(path: str, target: Path, source: os.stat_result) -> None:
    os.chown(target, source.st_uid, source.st_gid, follow_symlinks=False)
    if not stat.S_ISLNK(source.st_mode):
        os.chmod(target, stat.S_IMODE(source.st_mode))
        names = os.listxattr(path, follow_symlinks=False)
        for name in set(os.listxattr(target, follow_symlinks=False)) - set(names):
            os.removexattr(target, name, follow_symlinks=False)  # a directory no longer opaque, say
        for name in names:
            os.setxattr(target, name, os.getxattr(path, name, follow_symlinks=False), follow_symlinks=False)
    os.utime(target, ns=(source.st_atime_ns, source.st_mtime_ns), follow_symlinks=False)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
