"""Thin ctypes wrappers for the Linux calls Python 3.10/3.11 does not expose.

Every wrapper raises OSError with the errno and the call's arguments, so a failed sandbox
setup says which mount or namespace call failed and why.
"""

from __future__ import annotations

import ctypes
import os

from venusrl.sandbox import forkserver

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
# The new mount API has one number on every architecture.
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_IDMAP = 0x00100000
KEYCTL_JOIN_SESSION_KEYRING = 1


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


setns = forkserver.setns  # one wrapper: the image zygote runs forkserver.py without venusrl


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r})",
    )


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount2({target!r})")


def pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT[os.uname().machine]
    _check(_libc.syscall(ctypes.c_long(number), new_root.encode(), put_old.encode()), f"pivot_root({new_root!r})")


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, ctypes.c_size_t(len(raw))), f"sethostname({name!r})")


def prctl(option: int, arg: int, arg3: int = 0) -> None:
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(arg3), 0, 0),
           f"prctl({option}, {arg}, {arg3:#x})")


def open_tree_clone(path: str) -> int:
    """A detached copy of the mount tree at `path` (the start of an idmapped bind)."""
    fd = _libc.syscall(ctypes.c_long(_SYS_OPEN_TREE), ctypes.c_int(AT_FDCWD), path.encode(),
                       ctypes.c_uint(OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"open_tree({path!r}): {os.strerror(err)}")
    return fd


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def set_idmap(tree_fd: int, userns_fd: int) -> None:
    """Make the detached tree `tree_fd` show ids as the user namespace `userns_fd` maps them."""
    attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
    _check(_libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(tree_fd), b"",
                         ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE), ctypes.byref(attr),
                         ctypes.c_size_t(ctypes.sizeof(attr))),
           "mount_setattr(MOUNT_ATTR_IDMAP)")


def move_mount(tree_fd: int, target: str) -> None:
    _check(_libc.syscall(ctypes.c_long(_SYS_MOVE_MOUNT), ctypes.c_int(tree_fd), b"", ctypes.c_int(AT_FDCWD),
                         target.encode(), ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)),
           f"move_mount(-> {target!r})")


def join_new_session_keyring() -> None:
    """Replace the inherited session keyring with a new empty one owned by the caller."""
    number = _SYS_KEYCTL[os.uname().machine]
    result = _libc.syscall(ctypes.c_long(number), ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), None)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"keyctl(KEYCTL_JOIN_SESSION_KEYRING): {os.strerror(err)}")
