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

from venusrl.sandbox.spec import SANDBOX_UID

SNAPSHOT = "at-command-start.tar"


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
    def snapshot_path(self) -> Path:
        return self.base / SNAPSHOT

    def pack(self, into: str = "-") -> bytes:
        """The layer as a tar archive (written to `into` when it names a file)."""
        done = subprocess.run(
            ["tar", "-C", str(self.base), "--xattrs", "--xattrs-include=trusted.*", "-cf", into, "upper", "tmp"],
            capture_output=True,
        )
        if done.returncode != 0:
            raise OSError(f"tar of {self.base} failed: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout

    def snapshot(self) -> None:
        partial = self.snapshot_path.with_suffix(".partial")
        self.pack(str(partial))
        os.replace(partial, self.snapshot_path)

    def drop_snapshot(self) -> None:
        self.snapshot_path.unlink(missing_ok=True)

    def archive(self, at_command_start: bool) -> bytes:
        """The snapshot when asked for and one exists (a command is in flight), else the
        layer as it is now."""
        if at_command_start and self.snapshot_path.is_file():
            return self.snapshot_path.read_bytes()
        return self.pack()

    def restore_snapshot(self) -> bool:
        """Put the files back as the in-flight command found them; False without a snapshot."""
        if not self.snapshot_path.is_file():
            return False
        archive = self.snapshot_path.read_bytes()
        for d in (self.upper, self.tmp):
            shutil.rmtree(d, ignore_errors=True)
        self.unpack(archive)
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
