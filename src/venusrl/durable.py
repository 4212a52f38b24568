"""Durable writes into a run directory: after a kill (or a power loss) a file holds its old
content or its new content, never a torn mix. Write a temporary file beside the target,
fsync it, rename it over the target, fsync the directory (the rename itself is only
durable once the directory is)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` in one step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with temporary.open("wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def append_durable(path: Path, text: str) -> None:
    """Append `text` and flush it to disk; a kill can tear only this last line (readers of
    append-only logs skip a torn last line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def rename_durable(source: Path, target: Path) -> None:
    """Rename `source` (a file or a finished directory) to `target`, durably."""
    source.rename(target)
    fsync_path(target.parent)
