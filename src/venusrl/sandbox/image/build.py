"""Building images from files on this machine, with no registry and no daemon: how the
tests, the sandbox bench and `swe-lite` get real images to import.

`host_rootfs` assembles a small root filesystem from this host's bash, coreutils, procps
and system Python (with the dynamic libraries each needs, and optionally pure-Python
packages such as pytest); `write_oci` and `write_docker_archive` pack layers and a config
exactly as an OCI image layout and a `docker save` tarball lay them out, so the importer
reads the same bytes a user's file would have.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("bash", "sh", "ls", "cat", "id", "env", "ps", "grep", "find", "sleep", "mkdir", "echo", "printf",
            "kill", "setsid", "stat", "head", "tail", "wc", "rm", "cp", "mv", "touch", "chmod", "true", "false",
            "sed", "tr", "uname", "hostname", "whoami", "mount", "dd", "seq", "sort", "test", "readlink", "expr",
            "python3", "timeout", "unshare")
STDLIB_SKIP = {"ensurepip", "idlelib", "tkinter", "turtledemo", "lib2to3", "pydoc_data", "test"}
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py", "pygments")


HOST_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


def host_rootfs(dest: Path, python_packages: tuple[str, ...] = ()) -> Path:
    """Copy this host's programs, their libraries and the system Python's stdlib into
    `dest`, plus `python_packages` (pure-Python, from this interpreter's path)."""
    dest.mkdir(parents=True, exist_ok=True)
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # Debian's merged /usr
        if Path(f"/{top}").is_symlink():
            os.symlink(os.readlink(f"/{top}"), dest / top)
    libraries: set[str] = set()
    for name in PROGRAMS:
        found = shutil.which(name, path=HOST_PATH)
        if found is not None:
            _copy(found, dest)
            libraries |= _libraries(found)
    stdlib, site_dir = _python_paths(shutil.which("python3", path=HOST_PATH))
    target = dest / stdlib.relative_to("/")
    shutil.copytree(stdlib, target, symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in STDLIB_SKIP or n.startswith("config-")
                                             or n in ("site-packages", "dist-packages")])
    for so in (target / "lib-dynload").glob("*.so"):
        libraries |= _libraries(str(so))
    for lib in sorted(libraries):
        _copy(lib, dest)
    packages = dest / site_dir.relative_to("/")
    packages.mkdir(parents=True, exist_ok=True)
    for name in python_packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"python package {name!r} is not installed here")
        source = Path(spec.origin)
        if source.name == "__init__.py":
            shutil.copytree(source.parent, packages / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, packages / source.name)
    for d in ("tmp", "proc", "dev", "etc", "root", "opt", "srv"):
        (dest / d).mkdir(exist_ok=True)
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (dest / "etc" / "group").write_text("root:x:0:\n")
    return dest


def _python_paths(python: str | None) -> tuple[Path, Path]:
    """The system Python's stdlib and its last site directory (the image runs that Python)."""
    if python is None:
        raise RuntimeError("test images need the system python3")
    code = "import site, sysconfig; print(sysconfig.get_paths()['stdlib']); print(site.getsitepackages()[-1])"
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return Path(out[0]), Path(out[1])


def _libraries(binary: str) -> set[str]:
    done = subprocess.run(["ldd", binary], capture_output=True, text=True)
    return {token for line in done.stdout.splitlines() for token in line.split() if token.startswith("/")}


def _copy(path: str, dest: Path) -> None:
    """Copy `path` to the same place under `dest`; a symlink is copied as a symlink, and
    what it points to as well."""
    canonical = Path(os.path.realpath(os.path.dirname(path))) / os.path.basename(path)
    target = dest / str(canonical).lstrip("/")
    if os.path.lexists(target):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if canonical.is_symlink():
        _copy(os.path.realpath(canonical), dest)
        os.symlink(os.readlink(canonical), target)
    else:
        shutil.copy2(canonical, target)


@dataclass
class LayerTar:
    """One layer's uncompressed tar: a directory on disk plus extra entries (whiteouts)."""

    tar: bytes = b""
    diff_id: str = ""

    @classmethod
    def from_dir(cls, root: Path, owners: dict[str, int] | None = None,
                 extra: dict[str, bytes] | None = None) -> LayerTar:
        """`owners`: path -> uid (and gid) for entries below `root`; `extra`: name -> content
        of additional regular files (such as `.wh.` whiteouts) added after the tree."""
        owners = owners or {}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            def owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
                rel = info.name.removeprefix("./")
                uid = next((u for p, u in owners.items() if rel == p or rel.startswith(p + "/")), 0)
                info.uid = info.gid = uid
                info.uname = info.gname = ""
                info.mtime = 0  # reproducible: the same files make the same layer (and diff_id)
                return info

            for child in sorted(root.iterdir()):
                tar.add(child, arcname=child.name, filter=owner)
            for name, content in (extra or {}).items():
                info = tarfile.TarInfo(name)
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
        raw = buffer.getvalue()
        return cls(raw, "sha256:" + hashlib.sha256(raw).hexdigest())


@dataclass
class ImageSpec:
    layers: list[LayerTar]
    env: list[str] = field(default_factory=list)
    working_dir: str = ""
    user: str = ""
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None

    def config(self) -> bytes:
        run = {"Env": self.env, "WorkingDir": self.working_dir, "User": self.user}
        if self.entrypoint is not None:
            run["Entrypoint"] = self.entrypoint
        if self.cmd is not None:
            run["Cmd"] = self.cmd
        return json.dumps({"architecture": "amd64", "os": "linux", "config": run,
                           "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in self.layers]}},
                          sort_keys=True).encode()


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def write_oci(image: ImageSpec, dest: Path, ref: str | None = "latest", gzip_layers: bool = True) -> Path:
    """An OCI image layout directory holding one image."""
    return write_oci_layout({ref: image}, dest, gzip_layers)


def write_oci_layout(images: dict[str | None, ImageSpec], dest: Path, gzip_layers: bool = True) -> Path:
    """An OCI image layout directory holding `images` by ref name; a layer several images
    share is one blob (layers gzipped, as registries and umoci store them)."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer_descs: dict[str, dict] = {}

    def blob(raw: bytes) -> str:
        digest = _sha(raw)
        (blobs / digest).write_bytes(raw)
        return "sha256:" + digest

    descriptors = []
    for ref, image in images.items():
        for layer in image.layers:
            if layer.diff_id not in layer_descs:
                raw = gzip.compress(layer.tar, compresslevel=1, mtime=0) if gzip_layers else layer.tar
                media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzip_layers else "")
                layer_descs[layer.diff_id] = {"mediaType": media, "digest": blob(raw), "size": len(raw)}
        config = image.config()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                          "digest": blob(config), "size": len(config)},
                               "layers": [layer_descs[layer.diff_id] for layer in image.layers]}).encode()
        descriptor = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": blob(manifest),
                      "size": len(manifest)}
        if ref is not None:
            descriptor["annotations"] = {"org.opencontainers.image.ref.name": ref}
        descriptors.append(descriptor)
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": descriptors}))
    (dest / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return dest


def write_docker_archive(image: ImageSpec, dest: Path, tag: str = "test/image:latest") -> Path:
    """A `docker save` tarball in the classic layout: ID/layer.tar, CONFIG.json, manifest.json."""
    config = image.config()
    config_name = f"{_sha(config)}.json"
    with tarfile.open(dest, "w") as tar:
        def add(name: str, raw: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))

        add(config_name, config)
        names = []
        for layer in image.layers:
            name = f"{layer.diff_id.removeprefix('sha256:')}/layer.tar"
            add(name, layer.tar)
            names.append(name)
        add("manifest.json", json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": names}]).encode())
    return dest
