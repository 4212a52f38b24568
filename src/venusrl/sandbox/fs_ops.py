"""Filesystem operations beyond read/write, run by a sandbox's init on its own root: what
the E2B filesystem service needs (stat, list to a depth, make a directory, remove, move).
Errors are the OSErrors themselves; the init reports them with the path (sandbox_init)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from typing import Any


def entry(path: str) -> dict[str, Any]:
    """One entry as envd describes it: a symlink is reported with its target's type."""
    st = os.lstat(path)
    target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    if target is not None:
        with contextlib.suppress(OSError):  # a dangling link: describe the link itself
            st = os.stat(path)
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
    return {"name": os.path.basename(path.rstrip("/")) or "/", "type": kind, "path": path,
            "size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "permissions": stat.filemode(st.st_mode),
            "owner": _name(st.st_uid), "group": _name(st.st_gid), "mtime": st.st_mtime,
            "symlink_target": target}


def _name(ident: int) -> str:
    # A sandbox runs as a leased host uid that no passwd file names: the number is the name.
    return str(ident)


def entries(path: str, depth: int) -> list[dict[str, Any]]:
    """The entries under `path`, `depth` levels down (1: its children), sorted by path."""
    if not os.path.isdir(path):
        raise NotADirectoryError(20, "Not a directory", path)
    found = []
    level = [path]
    for _ in range(depth):
        below = []
        for directory in level:
            for child in sorted(os.scandir(directory), key=lambda e: e.name):
                found.append(entry(child.path))
                if child.is_dir(follow_symlinks=False):
                    below.append(child.path)
        level = below
    return found


def make_dir(path: str) -> bool:
    """False when it already exists (envd answers `already_exists`)."""
    if os.path.isdir(path):
        return False
    os.makedirs(path)
    return True


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def move(source: str, destination: str) -> dict[str, Any]:
    os.makedirs(os.path.dirname(destination) or ".", exist_ok=True)
    os.rename(source, destination)
    return entry(destination)
