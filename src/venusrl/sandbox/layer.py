"""A sandbox's writable layer on the host: overlay upper, overlay work and /tmp.

The layer is the sandbox's whole file state; it is packed with GNU tar keeping the
`trusted.*` xattrs and whiteout devices of overlayfs, so a layer moved to another node
shows exactly the same files over the same template.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

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

    def pack(self) -> bytes:
        done = subprocess.run(
            ["tar", "-C", str(self.base), "--xattrs", "--xattrs-include=trusted.*", "-cf", "-", "upper", "tmp"],
            capture_output=True,
        )
        if done.returncode != 0:
            raise OSError(f"tar of {self.base} failed: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout

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
