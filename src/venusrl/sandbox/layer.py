"""A sandbox's writable layer on the host: overlay upper, overlay work and /tmp.

The layer is the sandbox's whole file state; it is packed with GNU tar keeping the
`trusted.*` xattrs and whiteout devices of overlayfs, so a layer moved to another node
shows exactly the same files over the same template. A snapshot is the packed layer as
a command found it (see flight.py): what a migration or a recovery restores while that
command is in flight, so that re-running it applies its effects once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from venusrl.sandbox.mirror import mirror
from venusrl.sandbox.spec import SANDBOX_UID


@dataclass(frozen=True)
class Layer:
    base: Path

    @property
    def upper(self) -> Path:
        return self.base / "upper"

    @property
    def work(self) -> Path:
        return self.base / "work"

    @property
    def tmp(self) -> Path:
        return self.base / "tmp"

    def create(self, uid: int = SANDBOX_UID) -> None:
        for d in (self.upper, self.work, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        os.chown(self.upper, uid, uid)
        os.chmod(self.tmp, 0o1777)

    def reset_work(self) -> None:
        """A fresh overlay work directory, required before the layer is mounted again."""
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)

    @property
    def snapshot_dir(self) -> Path:
        # beside the layer, not in it: the layer is the sandbox's quota filesystem, and the
        # snapshot is the node's bookkeeping (a full quota must not fail the next snapshot)
        return self.base.parent / "snapshot"

    @property
    def _in_flight(self) -> Path:
        return self.base.parent / "snapshot.in-flight"  # present: the snapshot is a running command's start

    def pack(self, into: str = "-", base: Path | None = None) -> bytes:
        """The layer (or the tree at `base` laid out like it) as a tar archive, written to
        `into` when it names a file."""
        done = subprocess.run(
            ["tar", "-C", str(base or self.base), "--xattrs", "--xattrs-include=trusted.*", "-cf", into, "upper", "tmp"],
            capture_output=True,
        )
        if done.returncode != 0:
            raise OSError(f"tar of {self.base} failed: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout

    def _pairs(self, reverse: bool = False) -> list[tuple[Path, Path]]:
        pairs = [(self.upper, self.snapshot_dir / "upper"), (self.tmp, self.snapshot_dir / "tmp")]
        return [(b, a) for a, b in pairs] if reverse else pairs

    def snapshot(self) -> None:
        """Save the layer as the command about to start finds it. Incremental: only what
        changed since the previous command's snapshot is copied (mirror.py)."""
        mirror(self._pairs(), self.base.parent / "snapshot.stamp")
        self._in_flight.touch()

    def drop_snapshot(self) -> None:
        """The command is over; its snapshot is kept as the base of the next one."""
        self._in_flight.unlink(missing_ok=True)

    def archive(self, at_command_start: bool) -> bytes:
        """The snapshot when asked for and a command is in flight, else the layer now."""
        if at_command_start and self._in_flight.is_file():
            return self.pack(base=self.snapshot_dir)
        return self.pack()

    def restore_snapshot(self) -> bool:
        """Put the files back as the in-flight command found them; False without one."""
        if not self._in_flight.is_file():
            return False
        mirror(self._pairs(reverse=True), None)
        self.reset_work()
        return True

    def unpack(self, archive: bytes) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["tar", "-C", str(self.base), "--xattrs", "--xattrs-include=trusted.*", "--same-owner", "-xpf", "-"],
            input=archive,
            capture_output=True,
        )
        if done.returncode != 0:
            raise OSError(f"untar into {self.base} failed: {done.stderr.decode(errors='replace').strip()}")
        self.reset_work()

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)
