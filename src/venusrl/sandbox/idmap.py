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


def map_user_namespace(holder: int, mapping: str) -> int:
    """Write `mapping` as the uid and gid map of the fresh user namespace that process
    `holder` (a host pid) has just unshared, and return an fd of that namespace. A process
    cannot leave a user namespace it entered, so another process must hold it: for a
    sandbox, its keeper (sandbox_init.py), which needs no privilege once the init is forked."""
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{holder}/{name}", "w") as f:
            f.write(mapping)
    return os.open(f"/proc/{holder}/ns/user", os.O_RDONLY | os.O_CLOEXEC)


def idmapped_bind(source: str, target: str, userns_fd: int) -> None:
    """Bind `source` (recursively) at `target`, with ids mapped through `userns_fd`."""
    tree = linux.open_tree_clone(source)
    try:
        linux.set_idmap(tree, userns_fd)
        linux.move_mount(tree, target)
    finally:
        os.close(tree)
