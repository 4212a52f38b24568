"""Test images built at test time from files on this machine: no registry, no daemon.

`host_rootfs` assembles a minimal root filesystem from this host's bash, coreutils, procps
and Python (with the dynamic libraries each needs, and optionally pytest); `write_oci` and
`write_docker_archive` pack layers and a config exactly as an OCI image layout and a
`docker save` tarball lay them out, so the importer reads the same bytes a user's file has.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("bash", "sh", "ls", "cat", "id", "env", "ps", "grep", "find", "sleep", "mkdir", "echo", "printf",
            "kill", "setsid", "stat", "head", "tail", "wc", "rm", "cp", "mv", "touch", "chmod", "true", "false",
            "sed", "tr", "uname", "hostname", "whoami", "mount", "dd", "seq", "sort", "test", "readlink", "expr",
            "python3", "timeout", "unshare")
STDLIB_SKIP = {"ensurepip", "idlelib", "tkinter", "turtledemo", "lib2to3", "pydoc_data", "test", "unittest"}
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py.py", "pygments")


HOST_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


def host_rootfs(dest: Path, with_pytest: bool = False) -> Path:
    """Copy this host's programs, their libraries and Python's stdlib into `dest`."""
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
    if with_pytest:
        site = Path(next(p for p in sys.path if p.endswith("site-packages")))
        packages = dest / site_dir.relative_to("/")
        packages.mkdir(parents=True, exist_ok=True)
        for name in PYTEST_PACKAGES:
            source = site / name
            if source.is_dir():
                shutil.copytree(source, packages / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.is_file():
                shutil.copy2(source, packages / name)
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
class Layer:
    """One layer: a directory on disk plus extra entries (whiteouts, owners) given by name."""

    tar: bytes = b""
    diff_id: str = ""

    @classmethod
    def from_dir(cls, root: Path, owners: dict[str, int] | None = None,
                 extra: dict[str, bytes] | None = None) -> Layer:
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
class Image:
    layers: list[Layer]
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


def write_oci(image: Image, dest: Path, ref: str | None = "latest", gzip_layers: bool = True) -> Path:
    """An OCI image layout directory (layers gzipped, as registries and umoci store them)."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(raw: bytes) -> str:
        digest = _sha(raw)
        (blobs / digest).write_bytes(raw)
        return "sha256:" + digest

    layer_descs = []
    for layer in image.layers:
        raw = gzip.compress(layer.tar, compresslevel=1, mtime=0) if gzip_layers else layer.tar
        media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzip_layers else "")
        layer_descs.append({"mediaType": media, "digest": blob(raw), "size": len(raw)})
    config = image.config()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": blob(config), "size": len(config)},
                           "layers": layer_descs}).encode()
    descriptor = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": blob(manifest),
                  "size": len(manifest)}
    if ref is not None:
        descriptor["annotations"] = {"org.opencontainers.image.ref.name": ref}
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [descriptor]}))
    (dest / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return dest


def write_docker_archive(image: Image, dest: Path, tag: str = "test/image:latest") -> Path:
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


@dataclass
class ImageSet:
    """The images the sandbox image tests share: `app` and `other` have the same base layer."""

    base: Layer
    app: Image
    other: Image
    oci_app: Path  # OCI layout directory of `app`
    docker_app: Path  # docker-archive of the same image
    oci_other: Path


APP_ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello-from-image"]


def build_test_images(work: Path) -> ImageSet:
    rootfs = host_rootfs(work / "rootfs", with_pytest=True)
    (rootfs / "opt" / "gone.txt").write_text("deleted by the app layer\n")
    (rootfs / "opt" / "dir").mkdir()
    for name in ("a", "b"):
        (rootfs / "opt" / "dir" / name).write_text(f"{name} from base\n")
    base = Layer.from_dir(rootfs)
    app_dir = work / "app-layer"
    (app_dir / "etc").mkdir(parents=True)
    (app_dir / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                            "app:x:1000:1000:app:/home/app:/bin/bash\n")
    (app_dir / "etc" / "group").write_text("root:x:0:\napp:x:1000:\nstaff:x:50:app\n")
    (app_dir / "home" / "app").mkdir(parents=True)
    (app_dir / "workspace").mkdir()  # the base sandboxes' probes write there
    (app_dir / "home" / "app" / "notes.txt").write_text("image file\n")
    (app_dir / "opt" / "dir").mkdir(parents=True)
    (app_dir / "opt" / "dir" / "c").write_text("c from app\n")
    app_layer = Layer.from_dir(app_dir, owners={"home/app": 1000, "workspace": 1000},
                               extra={"opt/.wh.gone.txt": b"", "opt/dir/.wh..wh..opq": b""})
    app = Image([base, app_layer], env=APP_ENV, working_dir="/home/app", user="app", cmd=["/bin/bash"])
    other_dir = work / "other-layer"
    (other_dir / "srv").mkdir(parents=True)
    (other_dir / "srv" / "other.txt").write_text("other image\n")
    other = Image([base, Layer.from_dir(other_dir)], env=APP_ENV, working_dir="/srv")
    return ImageSet(base, app, other, write_oci(app, work / "app-oci", ref="app:latest"),
                      write_docker_archive(app, work / "app-docker.tar", tag="test/app:latest"),
                      write_oci(other, work / "other-oci", ref="other:latest"))
