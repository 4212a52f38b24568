"""Weights to engine processes on the same host through shared memory (the CPU's transport;
CUDA IPC is the GPU's): the pushing process writes one push once into a file under
/dev/shm that it and the engines map shared; each engine gets only the file's name, the
layout and the version over its socket, and copies from the mapping into its parameters.

Layout: a 64-byte header (two int64 version stamps, `begin` and `end`), then the packed
weights (weights/layout.py). The writer sets `begin`, packs, then sets `end`.

Invariant: a reader copies only from a segment that holds the announced version whole
(`begin == end == version` when its copy starts); otherwise ValueError ("torn or stale")
and the engine keeps its weights and version. The writer rewrites the segment only after
every engine acknowledged the previous push (`WeightPusher` holds one lock across the write
and the acknowledgements), so a segment whole when a copy starts stays whole until it ends.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from pathlib import Path

import torch

from venusrl.weights.layout import WeightLayout

log = logging.getLogger(__name__)
HEADER_BYTES = 64
PREFIX = "venusrl-weights-"


def shm_directory() -> Path:
    """/dev/shm where there is one (Linux: memory, not disk), else the temp directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _map(path: Path, nbytes: int) -> torch.Tensor:
    return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)


def remove_orphans(directory: Path) -> list[Path]:
    """Segments left by pushing processes that are gone (killed before `close`): /dev/shm is
    memory, so each would hold a model's worth of it until reboot."""
    removed = []
    for path in directory.glob(f"{PREFIX}*"):
        pid = path.name.removeprefix(PREFIX).split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class SharedMemoryWriter:
    """The pushing process's segment, kept across pushes (its pages are faulted in once)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or shm_directory()
        self.path: Path | None = None
        self.buffer: torch.Tensor | None = None

    def write(self, weights: dict[str, torch.Tensor], layout: WeightLayout, version: int) -> dict:
        """Pack `weights` into the segment stamped with `version`; the message fields an
        engine needs to read it."""
        size = HEADER_BYTES + layout.nbytes
        if self.buffer is None or self.buffer.numel() < size:
            self.close()
            for orphan in remove_orphans(self.directory):
                log.info("removed the weight segment %s of a process that is gone", orphan)
            self.path = self.directory / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
            with open(self.path, "wb") as f:
                f.truncate(size)
            self.buffer = _map(self.path, size)
        stamps = self.buffer[:16].view(torch.int64)
        stamps[0] = version
        layout.pack(weights, self.buffer[HEADER_BYTES:size])
        stamps[1] = version
        return {"path": str(self.path), "size": size}

    def close(self) -> None:
        """Unlink the segment (engines that still map it keep their mapping until they drop it)."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        self.path, self.buffer = None, None


class SharedMemoryReader:
    """An engine process's mapping of the writer's segment, kept while the writer keeps it."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.buffer: torch.Tensor | None = None

    def views(self, path: str, size: int, layout: WeightLayout, version: int) -> dict[str, torch.Tensor]:
        """The pushed tensors as views into the segment; ValueError naming what is wrong when
        the segment is not a weight segment, is too small, or does not hold `version` whole."""
        resolved = Path(path).resolve()
        if resolved.parent != shm_directory().resolve() or not resolved.name.startswith(PREFIX):
            raise ValueError(f"shared weights: {path!r} is not a {PREFIX}* segment in {shm_directory()}")
        if not resolved.is_file() or resolved.stat().st_size < size or size < HEADER_BYTES + layout.nbytes:
            raise ValueError(f"shared weights: {path} is missing or smaller than the {size} bytes of the push")
        if self.path != str(resolved) or self.buffer is None or self.buffer.numel() != size:
            self.path, self.buffer = str(resolved), _map(resolved, size)
        begin, end = (int(v) for v in self.buffer[:16].view(torch.int64))
        if not begin == end == version:
            raise ValueError(f"shared weights: {path} holds versions {begin}..{end}, not version {version} whole "
                             "(a torn or stale push)")
        return layout.views(self.buffer[HEADER_BYTES:size])
