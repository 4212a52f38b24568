"""Reading an image from an OCI image layout (a directory or a tar of one) or from a
docker-archive (`docker save`) tarball, into one `ImageManifest`.

Nothing is trusted: JSON blobs are checked against their digests when the format names
one, and every layer is checked against the config's `rootfs.diff_ids` as it is unpacked.
Errors are `ImageError`s that name the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import platform
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from venusrl.sandbox.errors import InvalidRequest

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


class ImageError(InvalidRequest):
    """An image file is malformed or names something it does not contain."""


@dataclass(frozen=True)
class LayerBlob:
    open: Callable[[], IO[bytes]]  # the layer as stored: tar, gzip or zstd
    digest: str | None  # digest of the stored bytes, when the format names one
    diff_id: str  # digest of the uncompressed tar (from the config)
    where: str  # for error messages


@dataclass(frozen=True)
class ImageManifest:
    config: dict[str, Any]
    config_digest: str  # the image ID: the same for both packagings of one image
    layers: tuple[LayerBlob, ...]  # bottom first
    ref: str | None  # the name the file gives the image, if any
    format: str


class _Source:
    """Files of a layout, either in a directory or in a tar (random access by name)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tar: tarfile.TarFile | None = None
        if path.is_file():
            try:
                self.tar = tarfile.open(path)  # noqa: SIM115 - closed by close(), after the layers are read
            except tarfile.TarError as err:
                raise ImageError(f"{path}: not a tar archive ({err})") from None
            self.members = {_norm(m.name): m for m in self.tar.getmembers() if m.isfile()}
        elif not path.is_dir():
            raise ImageError(f"{path}: no such file or directory")

    def exists(self, name: str) -> bool:
        return name in self.members if self.tar else (self.path / name).is_file()

    def open(self, name: str) -> IO[bytes]:
        if self.tar is None:
            try:
                return open(self.path / name, "rb")
            except OSError as err:
                raise ImageError(f"{self.path}: cannot read {name} ({err.strerror})") from None
        member = self.members.get(_norm(name))
        if member is None:
            raise ImageError(f"{self.path}: the archive has no {name}")
        stream = self.tar.extractfile(member)
        assert stream is not None
        return stream

    def json(self, name: str, digest: str | None = None) -> Any:
        with self.open(name) as f:
            raw = f.read()
        if digest is not None and _sha256(raw) != digest:
            raise ImageError(f"{self.path}: {name} does not match its digest {digest}")
        try:
            return json.loads(raw)
        except ValueError as err:
            raise ImageError(f"{self.path}: {name} is not JSON ({err})") from None

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()


def read_image(path: Path, ref: str | None = None) -> tuple[ImageManifest, Callable[[], None]]:
    """The image at `path` (the one named `ref` when the file holds several) and a
    function that closes the file once its layers have been read."""
    source = _Source(path)
    try:
        if source.exists("manifest.json"):
            manifest = _docker_archive(source, ref)
        elif source.exists("index.json"):
            manifest = _oci_layout(source, ref)
        else:
            raise ImageError(f"{path}: neither an OCI image layout (index.json) nor a docker-archive (manifest.json)")
    except BaseException:
        source.close()
        raise
    return manifest, source.close


def _docker_archive(source: _Source, ref: str | None) -> ImageManifest:
    entries = source.json("manifest.json")
    if not isinstance(entries, list) or not entries:
        raise ImageError(f"{source.path}: manifest.json: expected a non-empty list of images")
    tags = [tag for entry in entries for tag in entry.get("RepoTags") or []]
    if ref is not None:
        chosen = [e for e in entries if ref in (e.get("RepoTags") or [])]
        if not chosen:
            raise ImageError(f"{source.path}: no image tagged {ref!r} (tags: {', '.join(tags) or 'none'})")
    elif len(entries) > 1:
        raise ImageError(f"{source.path}: holds {len(entries)} images; choose one with --ref (tags: {', '.join(tags)})")
    else:
        chosen = entries
    entry = chosen[0]
    for field in ("Config", "Layers"):
        if field not in entry:
            raise ImageError(f"{source.path}: manifest.json: image entry has no {field!r}")
    config_name = entry["Config"]
    with source.open(config_name) as f:
        raw = f.read()
    config = _parse_config(raw, f"{source.path}: {config_name}")
    diff_ids = _diff_ids(config, len(entry["Layers"]), f"{source.path}: {config_name}")
    layers = tuple(
        LayerBlob(lambda name=name: source.open(name), None, diff_id, f"{source.path}: {name}")
        for name, diff_id in zip(entry["Layers"], diff_ids, strict=True))
    name = ref or next(iter(entry.get("RepoTags") or []), None)
    return ImageManifest(config, _sha256(raw), layers, name, "docker-archive")


def _oci_layout(source: _Source, ref: str | None) -> ImageManifest:
    index = source.json("index.json")
    descriptors = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(descriptors, list) or not descriptors:
        raise ImageError(f"{source.path}: index.json: expected a non-empty 'manifests' list")
    names = [d.get("annotations", {}).get(REF_ANNOTATION) for d in descriptors]
    if ref is not None:
        chosen = [d for d, n in zip(descriptors, names, strict=True) if n == ref]
        if not chosen:
            raise ImageError(f"{source.path}: no image named {ref!r} (names: {', '.join(filter(None, names)) or 'none'})")
    elif len(descriptors) > 1:
        raise ImageError(f"{source.path}: holds {len(descriptors)} images; choose one with --ref "
                         f"(names: {', '.join(filter(None, names))})")
    else:
        chosen = descriptors
    descriptor = chosen[0]
    name = ref or descriptor.get("annotations", {}).get(REF_ANNOTATION)
    manifest = _resolve_platform(source, descriptor)
    config_desc = manifest.get("config")
    if not isinstance(config_desc, dict) or "digest" not in config_desc:
        raise ImageError(f"{source.path}: manifest {descriptor.get('digest')}: no config descriptor")
    config_name = _blob(config_desc["digest"], source.path)
    with source.open(config_name) as f:
        raw = f.read()
    if _sha256(raw) != config_desc["digest"]:
        raise ImageError(f"{source.path}: config blob does not match its digest {config_desc['digest']}")
    config = _parse_config(raw, f"{source.path}: {config_name}")
    descs = manifest.get("layers")
    if not isinstance(descs, list):
        raise ImageError(f"{source.path}: manifest {descriptor.get('digest')}: no 'layers' list")
    diff_ids = _diff_ids(config, len(descs), f"{source.path}: {config_name}")
    layers = []
    for desc, diff_id in zip(descs, diff_ids, strict=True):
        blob = _blob(desc.get("digest", ""), source.path)
        layers.append(LayerBlob(lambda blob=blob: source.open(blob), desc["digest"], diff_id, f"{source.path}: {blob}"))
    return ImageManifest(config, config_desc["digest"], tuple(layers), name, "oci")


def _resolve_platform(source: _Source, descriptor: dict[str, Any]) -> dict[str, Any]:
    """Follow image indexes down to the manifest for this machine's platform."""
    for _ in range(4):
        digest = descriptor.get("digest", "")
        document = source.json(_blob(digest, source.path), digest)
        if descriptor.get("mediaType") not in (OCI_INDEX, DOCKER_LIST) and "manifests" not in document:
            return document
        options = document.get("manifests") or []
        matching = [d for d in options
                    if d.get("platform", {}).get("os", "linux") == "linux"
                    and d.get("platform", {}).get("architecture", _ARCH) == _ARCH]
        if not matching:
            platforms = [f"{d.get('platform', {}).get('os')}/{d.get('platform', {}).get('architecture')}" for d in options]
            raise ImageError(f"{source.path}: index {digest} has no linux/{_ARCH} image (has {', '.join(platforms)})")
        descriptor = matching[0]
    raise ImageError(f"{source.path}: image indexes nested deeper than 4 levels")


def _blob(digest: str, path: Path) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or len(hexdigest) != 64 or not all(c in "0123456789abcdef" for c in hexdigest):
        raise ImageError(f"{path}: unsupported or malformed digest {digest!r} (expected sha256:<64 hex>)")
    return f"blobs/sha256/{hexdigest}"


def _parse_config(raw: bytes, where: str) -> dict[str, Any]:
    try:
        config = json.loads(raw)
    except ValueError as err:
        raise ImageError(f"{where}: the image config is not JSON ({err})") from None
    if not isinstance(config, dict):
        raise ImageError(f"{where}: the image config is not a JSON object")
    if config.get("os", "linux") != "linux":
        raise ImageError(f"{where}: os {config.get('os')!r}: only linux images run in sandboxes")
    return config


def _diff_ids(config: dict[str, Any], count: int, where: str) -> list[str]:
    diff_ids = (config.get("rootfs") or {}).get("diff_ids")
    if not isinstance(diff_ids, list) or len(diff_ids) != count:
        raise ImageError(f"{where}: rootfs.diff_ids lists {len(diff_ids) if isinstance(diff_ids, list) else 'no'} "
                         f"layers, the manifest {count}")
    for diff_id in diff_ids:
        _blob(diff_id, Path(where))
    return diff_ids


def _norm(name: str) -> str:
    return name.removeprefix("./").lstrip("/")


def _sha256(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()
