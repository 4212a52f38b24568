"""The content-addressed image store of one host, shared by every template and node agent.

Layout under the store's root:
  layers/sha256/HEX/        one unpacked layer (an overlayfs lower directory), by diff_id
  layers/sha256/HEX.json    written last: the layer is complete (size, file counts)
  images/NAME.json          an image: its config's parts and its layers, bottom first
  uses/NAME/USER-PID-ID     one per template pool using the image, flock'ed (shared) by its
                            node agent while it lives: `remove` refuses while any is held
  tmp/                      layers being unpacked (renamed into place when verified)

A layer is keyed by the digest of its uncompressed tar (diff_id), so one layer is stored
and paged in once whether it came gzipped in an OCI layout or plain in a docker-archive,
and whichever images share it. Imports hold an exclusive lock on the store; readers need
none (records and layers appear by rename, complete).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from venusrl.sandbox.image.config import ImageRecord, ImageUser, record_from_config, resolve_user
from venusrl.sandbox.image.formats import ImageError, read_image
from venusrl.sandbox.image.layers import OPAQUE_XATTR, unpack_layer

log = logging.getLogger(__name__)

DEFAULT_STORE = "/var/lib/venusrl/images"


@dataclass(frozen=True)
class ImportResult:
    record: ImageRecord
    new_layers: int  # unpacked by this import
    shared_layers: int  # already in the store


class ImageStore:
    def __init__(self, root: str | Path = DEFAULT_STORE) -> None:
        self.root = Path(root)

    @property
    def layers_dir(self) -> Path:
        return self.root / "layers" / "sha256"

    def layer_path(self, diff_id: str) -> Path:
        return self.layers_dir / diff_id.removeprefix("sha256:")

    def has_layer(self, diff_id: str) -> bool:
        return self.layer_path(diff_id).with_suffix(".json").is_file()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        for d in (self.layers_dir, self.root / "images", self.root / "tmp"):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)  # sandboxes see layers only through their overlay mounts
        with open(self.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def import_image(self, path: str | Path, name: str | None = None, ref: str | None = None) -> ImportResult:
        """Import the OCI layout or docker-archive at `path` as `name` (default: the name
        the file gives it, else its short image ID)."""
        manifest, close = read_image(Path(path), ref)
        try:
            image_name = name or manifest.ref or manifest.config_digest.removeprefix("sha256:")[:12]
            validate_name(image_name)
            new = shared = 0
            with self._locked():
                for index, blob in enumerate(manifest.layers):
                    if self.has_layer(blob.diff_id):
                        shared += 1
                        continue
                    staging = self.root / "tmp" / uuid.uuid4().hex
                    staging.mkdir()
                    try:
                        counts = unpack_layer(blob, staging)
                        os.rename(staging, self.layer_path(blob.diff_id))
                    except BaseException:
                        shutil.rmtree(staging, ignore_errors=True)
                        raise
                    self.layer_path(blob.diff_id).with_suffix(".json").write_text(
                        json.dumps({"diff_id": blob.diff_id, **counts}))
                    new += 1
                    log.info("image %s: layer %d/%d %s unpacked (%d files, %d MiB)", image_name, index + 1,
                             len(manifest.layers), blob.diff_id[:19], counts["files"], counts["bytes"] >> 20)
                record = record_from_config(image_name, manifest.config_digest,
                                            tuple(b.diff_id for b in manifest.layers), manifest.config,
                                            manifest.format, str(Path(path).resolve()))
                self.resolve_user(record)  # the image's User must exist before any sandbox needs it
                target = self._record_path(image_name)
                staging_record = self.root / "tmp" / f"{uuid.uuid4().hex}.json"
                staging_record.write_text(json.dumps(record.to_json(), indent=2))
                os.rename(staging_record, target)
        finally:
            close()
        log.info("image %s imported from %s (%s): %d layers new, %d already stored", image_name, path,
                 manifest.format, new, shared)
        return ImportResult(record, new, shared)

    def _record_path(self, name: str) -> Path:
        return self.root / "images" / f"{quote(name, safe='')}.json"

    def get(self, name: str) -> ImageRecord:
        """The image `name`, or `name@sha256:ID` to insist on one image ID (a prefix will do):
        a template pinned so must never start from a re-imported, different image."""
        name, _, pin = name.partition("@")
        path = self._record_path(name)
        if not path.is_file():
            known = ", ".join(r.name for r in self.images()) or "none"
            raise ImageError(f"image: no image {name!r} in the store {self.root} (imported: {known}); "
                             f"import it with `venusrl sandbox image import PATH --name {name}`")
        record = ImageRecord.from_json(json.loads(path.read_text()))
        if pin and not record.image_id.startswith(pin):
            raise ImageError(f"image {name}: is {record.image_id}, not the pinned {pin}")
        missing = [d for d in record.layers if not self.has_layer(d)]
        if missing:
            raise ImageError(f"image {name}: layer {missing[0]} is missing from the store {self.root}; import it again")
        return record

    def images(self) -> list[ImageRecord]:
        folder = self.root / "images"
        if not folder.is_dir():
            return []
        return [ImageRecord.from_json(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]

    def lower_dirs(self, record: ImageRecord) -> tuple[str, ...]:
        """The image's layers as overlayfs wants them: top first, relative to `layers_dir`."""
        return tuple(d.removeprefix("sha256:") for d in reversed(record.layers))

    def read_file(self, record: ImageRecord, path: str) -> str | None:
        """A text file of the merged image (None when absent), without mounting it."""
        rel = path.lstrip("/")
        parts = rel.split("/")
        for diff_id in reversed(record.layers):
            layer = self.layer_path(diff_id)
            target = layer / rel
            if target.is_file() and not target.is_symlink():
                return target.read_text(errors="replace")
            if target.exists() or target.is_symlink():
                return None  # a whiteout (character device) or something else hides it
            if any(_opaque(layer.joinpath(*parts[:i])) for i in range(1, len(parts))):
                return None
        return None

    def realpath(self, record: ImageRecord, path: str) -> str | None:
        """`path` in the merged image with every symlink followed as a process in the
        image would follow it; None when it does not exist."""
        pending = [p for p in path.split("/") if p]
        resolved: list[str] = []
        hops = 40  # the kernel's limit on symlinks in one lookup
        while pending:
            name = pending.pop(0)
            if name in (".", ".."):
                resolved[len(resolved) - (name == ".."):] = []
                continue
            entry = self._entry(record, "/".join([*resolved, name]))
            if entry is None:
                return None
            if entry.is_symlink():
                hops -= 1
                if hops < 0:
                    return None
                target = os.readlink(entry)
                if target.startswith("/"):
                    resolved = []
                pending[:0] = [p for p in target.split("/") if p]
                continue
            resolved.append(name)
        return "/" + "/".join(resolved)

    def resolve(self, record: ImageRecord, path: str) -> Path | None:
        """Where on the host the merged image keeps `path` (its topmost layer's entry)."""
        real = self.realpath(record, path)
        if real is None:
            return None
        return self._entry(record, real.lstrip("/")) if real != "/" else self.layer_path(record.layers[-1])

    def list_dir(self, record: ImageRecord, path: str) -> list[str]:
        """Names in the merged directory `path` (no symlinks in it), whiteouts honoured."""
        return sorted(n for n in {c.name for d in reversed(record.layers)
                                  if (self.layer_path(d) / path.strip("/")).is_dir()
                                  for c in (self.layer_path(d) / path.strip("/")).iterdir()}
                      if self._entry(record, f"{path.strip('/')}/{n}") is not None)

    def _entry(self, record: ImageRecord, rel: str) -> Path | None:
        """The topmost layer's entry for `rel` (whose parents are directories), or None when
        no layer has it or a whiteout or opaque directory hides it."""
        parts = rel.split("/")
        for diff_id in reversed(record.layers):
            layer = self.layer_path(diff_id)
            target = layer / rel
            if os.path.realpath(target.parent) == str(layer.joinpath(*parts[:-1])) and os.path.lexists(target):
                return None if stat.S_ISCHR(os.lstat(target).st_mode) else target  # a character device: whiteout
            if any(_opaque(layer.joinpath(*parts[:i])) for i in range(1, len(parts))):
                return None
        return None

    def use(self, name: str, holder: str) -> ImageUse:
        """Record that `holder` (a template pool of a node) uses image `name` (`NAME@ID` pins
        count as NAME) until the use is released or the holder's process ends."""
        name = name.partition("@")[0]
        with self._locked():
            self.get(name)
            folder = self._uses_dir(name)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{quote(holder, safe='')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.write(fd, json.dumps({"holder": holder, "pid": os.getpid()}).encode())
        return ImageUse(path, fd)

    def users(self, name: str) -> list[str]:
        """Who holds image `name` now (dropping the records of holders that died)."""
        folder = self._uses_dir(name)
        holders = []
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            with open(path, "rb") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    entry = json.loads(f.read() or b"{}")
                    holders.append(f"{entry.get('holder', path.name)} (pid {entry.get('pid', '?')})")
                    continue
            path.unlink()  # its holder is gone
        return holders

    def _uses_dir(self, name: str) -> Path:
        return self.root / "uses" / quote(name, safe="")

    def remove(self, name: str) -> int:
        """Forget image `name` and delete the layers no other image uses; returns how many
        layers went. Refused while a template pool uses it: overlayfs does not expect the
        layers under a mounted root (a sandbox's, an image zygote's) to change."""
        with self._locked():
            record = self.get(name)
            holders = self.users(name)
            if holders:
                raise ImageError(f"image {name}: in use by {', '.join(holders)}; stop those node agents "
                                 "(`venusrl sandbox serve`; their template pools hold it) before removing it")
            self._record_path(name).unlink()
            still_used = {d for other in self.images() for d in other.layers}
            gone = [d for d in dict.fromkeys(record.layers) if d not in still_used]
            for diff_id in gone:
                self.layer_path(diff_id).with_suffix(".json").unlink()  # incomplete from here on
                shutil.rmtree(self.layer_path(diff_id))
        log.info("image %s removed with %d unshared layers", name, len(gone))
        return len(gone)

    def resolve_user(self, record: ImageRecord) -> ImageUser:
        return resolve_user(record.user, self.read_file(record, "/etc/passwd") or "",
                            self.read_file(record, "/etc/group") or "", record.name)


@dataclass
class ImageUse:
    """One holder's use of an image: its record file, flock'ed for as long as it is open
    (the kernel drops the lock when the holder dies, so a crashed node leaves no use)."""

    path: Path
    fd: int

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)


def _opaque(directory: Path) -> bool:
    try:
        return os.getxattr(directory, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def validate_name(name: str) -> None:
    if not name or len(name) > 255 or any(c in name for c in "\0\n") or name.startswith("."):
        raise ImageError(f"--name: {name!r} is not a valid image name (1-255 characters, no leading '.')")
