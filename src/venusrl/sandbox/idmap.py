"""Idmapped bind mounts: one on-disk owner for every sandbox's files, seen as each sandbox's uid.

Template layers and every sandbox's writable layer are owned on disk by LAYER_UID, whatever
uid the sandbox runs as. The sandbox init mounts them through an idmapping LAYER_UID ->
the sandbox's uid, so the sandbox owns its workspace (it may chmod a template file, which
overlayfs copies up) and a layer moved to another node, or restarted under another uid,
needs no chown. Root stays root: overlayfs creates its work files with the mounter's
credentials, which must be representable in the idmapping.
"""

from __future__ import annotations

import os

from venusrl.sandbox import linux


def identity_plus(layer_uid: int, sandbox_uid: int) -> str:
    """The uid_map/gid_map text: root to root, the layer owner to the sandbox."""
    return f"0 0 1\n{layer_uid} {sandbox_uid} 1\n"


def user_namespace_fd(mapping: str, proc: str = "/proc") -> int:
    """An fd of a new user namespace with `mapping` for uids and gids. A child process
    creates the namespace (a process cannot leave one it entered), the parent writes the
    maps and opens the namespace, then the child exits. `proc` must be a procfs of the
    caller's PID namespace (the child's pid is looked up there)."""
    unshared_r, unshared_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(unshared_r)
            os.close(done_w)
            linux.unshare(linux.CLONE_NEWUSER)
            os.write(unshared_w, b"1")
            os.read(done_r, 1)  # returns at EOF: the parent holds the namespace
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(unshared_w)
    os.close(done_r)
    try:
        if os.read(unshared_r, 1) != b"1":
            raise OSError(f"user namespace for an idmapped mount: helper {pid} could not unshare")
        for name in ("uid_map", "gid_map"):
            with open(f"{proc}/{pid}/{name}", "w") as f:
                f.write(mapping)
        return os.open(f"{proc}/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(unshared_r)
        os.close(done_w)
        os.waitpid(pid, 0)


def idmapped_bind(source: str, target: str, userns_fd: int) -> None:
    """Bind `source` (recursively) at `target`, with ids mapped through `userns_fd`."""
    tree = linux.open_tree_clone(source)
    try:
        linux.set_idmap(tree, userns_fd)
        linux.move_mount(tree, target)
    finally:
        os.close(tree)
