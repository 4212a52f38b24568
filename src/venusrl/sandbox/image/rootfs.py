"""Inside a sandbox of an image template: its root filesystem and its user namespace.

Runs in the sandbox init (PID 1 of its namespaces, still host root, single-threaded),
in place of the base sandbox's tmpfs root:
- `/` is an overlay: the template's own layer and the image's layers from the store,
  read-only and shared by every sandbox on the host (one page cache for image files),
  under this sandbox's private upper directory; writes copy up and stay private;
- a fresh /proc of the sandbox's PID namespace, its own /dev and its private /tmp;
- then the init enters a new user namespace mapping image uids 0..65535 to the host's
  UID_BASE.. range the layers are owned by, so image files keep their owners, the image's
  root is root of nothing on the host, and the caller drops to the image's User.
The mount, network, PID, IPC and UTS namespaces stay owned by the host's user namespace:
even the image's root cannot mount, change the network or see past the sandbox.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from venusrl.sandbox import linux
from venusrl.sandbox.image.layers import UID_BASE, UID_COUNT

CLONE_NEWUSER = 0x10000000
MAX_OPTIONS = 4095  # mount(2) data is one page


@dataclass(frozen=True)
class ImageRoot:
    """The `image` part of a SandboxSpec."""

    image: str
    layers_dir: str  # the store's layer directory: lower layers are named relative to it
    lowers: tuple[str, ...]  # top first; absolute (the template's layer) or relative to layers_dir
    uid: int  # the image's User inside the user namespace
    gid: int
    workdir: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImageRoot:
        return cls(**{**data, "lowers": tuple(data["lowers"])})


def mount_root(spec: Any) -> None:
    """The overlay at `spec.root`: the image's layers under the private upper. Needs the
    host's root (the layers' opaque directories are trusted.* attributes, which overlayfs
    honours only for a mount made with it)."""
    image = ImageRoot.from_json(spec.image)
    linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
    # The merged root takes its owner from the upper directory: the image's root owns it.
    os.chown(spec.upper, UID_BASE, UID_BASE)
    os.chmod(spec.upper, 0o755)
    options = f"lowerdir={':'.join(image.lowers)},upperdir={spec.upper},workdir={spec.work}"
    if len(options) > MAX_OPTIONS:
        raise OSError(f"image {image.image}: {len(image.lowers)} layers do not fit one overlay mount")
    os.chdir(image.layers_dir)  # relative lower paths keep the options within one page
    linux.mount("overlay", spec.root, "overlay", linux.MS_NOSUID | linux.MS_NODEV, options)
    os.chdir("/")


def build_root(spec: Any, build_dev: Callable[[str], None],
               mount_state: Callable[[str, int, int], None] | None = None) -> None:
    """Mount the overlay root at `spec.root` with /proc, /dev, /tmp and, for a sandbox (not
    a template's setup, whose upper becomes the template's layer), the session's state
    directory (`mount_state(root, host uid, host gid)`); then pivot into it."""
    mount_root(spec)
    furnish_root(spec, build_dev, mount_state)
    enter_root(spec)


def furnish_root(spec: Any, build_dev: Callable[[str], None],
                 mount_state: Callable[[str, int, int], None] | None) -> None:
    """/dev, the session's state directory and /tmp in the mounted root (as the host's root)."""
    image = ImageRoot.from_json(spec.image)
    root = spec.root
    for mount_point in ("proc", "dev", "tmp"):
        os.makedirs(f"{root}/{mount_point}", exist_ok=True)
    build_dev(root)
    if mount_state is not None:
        mount_state(root, UID_BASE + image.uid, UID_BASE + image.gid)
    linux.mount(spec.tmp, f"{root}/tmp", None, linux.MS_BIND)
    linux.mount("none", f"{root}/tmp", None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_NOSUID | linux.MS_NODEV)


def enter_root(spec: Any, in_zygote_namespace: bool = False) -> None:
    """Mount the caller's PID namespace's /proc in the furnished root, pivot into it and
    enter the sandbox's user namespace. `in_zygote_namespace`: the caller is a sandbox
    init in the image zygote's user namespace (sandbox_init.py), whose keeper mounted and
    furnished the root."""
    image = ImageRoot.from_json(spec.image)
    root = spec.root
    linux.mount("proc", f"{root}/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
    os.chdir(root)
    linux.pivot_root(".", ".")  # the old root is stacked under the new one: detach it
    linux.umount(".", linux.MNT_DETACH)
    os.chdir("/")
    if not os.path.exists("/bin/bash"):
        raise OSError(f"image {image.image} has no /bin/bash: sandbox commands run in a bash session")
    if in_zygote_namespace:
        # Become the zygote namespace's root (the host's UID_BASE), which owns the image's
        # ids there: a user namespace's creator must be mapped in its parent, and files it
        # makes must have an owner the namespace knows. Stay dumpable, or the new
        # namespace's uid_map would stay the host root's file.
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        linux.prctl(linux.PR_SET_DUMPABLE, 1)
    if not os.path.isdir(image.workdir):  # as `docker run` does, owned by the image's User
        os.makedirs(image.workdir)
        os.chown(image.workdir, UID_BASE + image.uid, UID_BASE + image.gid)
    # Below the zygote's user namespace, which maps image ids to the host's already, the
    # sandbox's maps them to themselves.
    _enter_user_namespace(0 if in_zygote_namespace else UID_BASE)


def _enter_user_namespace(first: int) -> None:
    """Unshare a user namespace and have a helper still in its parent namespace (only it
    may map more than one id) write the maps, image ids 0.. to the parent's `first`..;
    returns once they are in place."""
    go_read, go_write = os.pipe()
    helper = os.fork()
    if helper == 0:
        code = 1
        try:
            os.close(go_write)
            if os.read(go_read, 1) == b"1":  # the init has unshared
                for name in ("uid_map", "gid_map"):
                    with open(f"/proc/{os.getppid()}/{name}", "w") as f:
                        f.write(f"0 {first} {UID_COUNT}\n")
                code = 0
        finally:
            os._exit(code)
    os.close(go_read)
    try:
        linux.unshare(CLONE_NEWUSER)
        os.write(go_write, b"1")
    finally:
        os.close(go_write)
        _, status = os.waitpid(helper, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError("could not map the sandbox's user namespace")


def identity(spec: Any) -> tuple[int, int, str]:
    """(uid, gid, cwd) the init drops to: the image's User and WorkingDir."""
    image = ImageRoot.from_json(spec.image)
    return image.uid, image.gid, image.workdir
