"""What a fork of a zygote does to become a sandbox, and the sandbox's request loop.

`become_sandbox` runs in the fork (here called the keeper): it joins the sandbox's
cgroups, unshares mount/network/IPC/UTS/PID namespaces and forks the sandbox init, then
waits for it so the init's exit is observable. The init is PID 1 of its namespace: it
builds a private root (read-only system binds, a fresh /proc and /dev, the template layer
under an overlay at /workspace, its own /tmp), pivots into it, drops to the sandbox's own
unprivileged uid with no capabilities and a fresh session keyring, installs the seccomp
filter (seccomp.py), reseeds random state, and serves requests on its channel.
Both set PDEATHSIG, so a zygote's death takes its sandboxes with it. A sandbox of an image
template gets the image's root instead, in a user namespace (image/rootfs.py), and then the
same keyring and seccomp filter. When the template's Python runs in the image (python_*
fields), its namespaces are made inside the image zygote's user and PID namespaces
(`_fork_in_zygote_namespaces`), and the node agent then forks the zygote into the sandbox
as its warm Python (forkserver.join_sandbox); the init itself runs no template Python.
"""

from __future__ import annotations

import base64
import errno
import os
import resource
import signal
import socket
import stat
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from venusrl.sandbox import forkserver, fs_ops, idmap, linux, protocol, seccomp
from venusrl.sandbox.image import rootfs
from venusrl.sandbox.processes import ProcessTable
from venusrl.sandbox.session import ShellSession
from venusrl.sandbox.spec import SANDBOX_UID, SandboxSpec
from venusrl.sandbox.template import Template, run_python_setup

NAMESPACES = linux.CLONE_NEWNS | linux.CLONE_NEWNET | linux.CLONE_NEWIPC | linux.CLONE_NEWUTS | linux.CLONE_NEWPID
DEVICES = ("null", "zero", "full", "random", "urandom")
BASE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
SESSION_STATE_DIR = "/run/venusrl"  # a small tmpfs of its own: the disk quota never blocks the session


def become_sandbox(spec: SandboxSpec, channel: socket.socket, template: Template, namespace: dict) -> None:
    """Never returns: the keeper exits when the sandbox init does."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        for procs in spec.cgroup_procs:
            Path(procs).write_text(str(os.getpid()))
        keeper = os.getpid()
        lent_r, lent_w = os.pipe()

        def run_init() -> None:
            os.close(lent_w)
            _run_init(spec, channel, template, namespace, (keeper, lent_r))

        if spec.zygote_pid is None:
            linux.unshare(NAMESPACES)
            pid = os.fork()
            if pid == 0:
                run_init()
        else:
            pid = _fork_in_zygote_namespaces(spec, run_init)
        os.close(lent_r)
        channel.close()
        # From here on the keeper only waits, so it needs no privilege: it enters a fresh
        # user namespace, lent to the init to describe the idmapping of the sandbox's layers.
        try:
            linux.unshare(linux.CLONE_NEWUSER)
            os.write(lent_w, b"1")
        finally:
            os.close(lent_w)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
    except BaseException:
        _report_failure(channel)
    finally:
        os._exit(code if code >= 0 else 1)


def _fork_in_zygote_namespaces(spec: SandboxSpec, run_init: Callable[[], None]) -> int:
    """For a template whose Python lives in an image zygote: a helper enters the zygote's
    user and PID namespaces, makes the sandbox's mount, network, IPC, UTS and PID
    namespaces there, and forks the init into them; returns the helper's pid (it exits
    with the init). So a fork of the zygote, which holds no host privilege, may join the
    sandbox (forkserver.join_sandbox); the sandbox's own processes get a user namespace
    below the zygote's that owns none of these. The keeper, still host root, mounts the
    sandbox's overlay root in the new mount namespace first (rootfs.mount_root says why),
    and furnishes it (files it makes there must have owners the host knows)."""
    _join(f"/proc/{spec.zygote_pid}/ns/pid", linux.CLONE_NEWPID)  # so the sandbox's lies below the zygote's
    made_r, made_w = os.pipe()
    go_r, go_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        code = 1
        try:
            os.close(made_r)
            os.close(go_w)
            linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
            # Still the host's uid 0, unmapped there but owner of the node's directories (the
            # init reaches the sandbox's root through them), with capabilities in it alone.
            _join(f"/proc/{spec.zygote_pid}/ns/user", linux.CLONE_NEWUSER)
            linux.unshare(NAMESPACES)
            os.write(made_w, b"1")
            if os.read(go_r, 1) == b"1":
                init = os.fork()
                if init == 0:
                    os.close(made_w)
                    os.close(go_r)
                    run_init()
                os.closerange(3, 65536)  # the channel above all: the init's exit must close it
                code = os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])
        finally:
            os._exit(code if code >= 0 else 1)
    os.close(made_w)
    os.close(go_r)
    try:
        if os.read(made_r, 1) != b"1":
            raise OSError(f"could not make namespaces in image zygote {spec.zygote_pid}'s user namespace")
        _join(f"/proc/{helper}/ns/mnt", linux.CLONE_NEWNS)
        rootfs.mount_root(spec)
        rootfs.furnish_root(spec, _build_dev, _mount_session_state)
        os.write(go_w, b"1")
    finally:
        os.close(made_r)
        os.close(go_w)
    return helper


def _join(path: str, kind: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        linux.setns(fd, kind)
    finally:
        os.close(fd)


def _report_failure(channel: socket.socket) -> None:
    try:
        with channel.makefile("wb") as out:
            protocol.send(out, {"ready": False, "error": traceback.format_exc(limit=3)})
    except OSError:
        pass


def _run_init(spec: SandboxSpec, channel: socket.socket, template: Template, namespace: dict,
              lent: tuple[int, int]) -> None:
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        keeper, lent_r = lent
        keeper_unshared = os.read(lent_r, 1) == b"1"  # before the fd is closed with the rest
        os.close(lent_r)
        if not keeper_unshared:
            raise OSError(f"keeper {keeper} could not enter a user namespace for the idmapped layers")
        os.closerange(3, channel.fileno())
        os.closerange(channel.fileno() + 1, 65536)
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # the zygote's stdio is the node agent's log
        os.close(devnull)
        linux.sethostname(spec.sandbox_id[:63])
        if spec.zygote_pid is not None:
            rootfs.enter_root(spec, in_zygote_namespace=True)
        elif spec.image is not None:
            rootfs.build_root(spec, _build_dev, _mount_session_state)  # unshares its user namespace before the filter denies it
        else:
            _build_root(spec, keeper)
        _restrict(spec)
        forkserver.reseed()
        session = ShellSession(spec.session_cwd, spec.session_env or _base_env(), SESSION_STATE_DIR)
        if template.image is None:  # an image template's Python state lives in its warm Python (forkserver.py)
            if spec.run_setup:
                run_python_setup(template, namespace)
            forkserver.run_python_start(template.name, template.python_start, namespace)
    except BaseException:
        _report_failure(channel)
        os._exit(1)
    _serve(channel, session, spec)
    os._exit(0)


def _build_root(spec: SandboxSpec, keeper: int) -> None:
    linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
    root = spec.root
    linux.mount("tmpfs", root, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "size=4m,mode=755")
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():
            os.symlink(os.readlink(host), f"{root}/{top}")
        elif host.is_dir():
            _bind(str(host), root, read_only=True)
    lower, upper, work, tmp = _stage_idmapped_layers(spec, f"{root}/.layers", keeper)
    # /tmp first: a read-only bind may lie below it (a venv or checkout under /tmp, as in CI)
    os.makedirs(f"{root}/tmp")
    linux.mount(tmp, f"{root}/tmp", None, linux.MS_BIND)
    linux.mount("none", f"{root}/tmp", None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_NOSUID | linux.MS_NODEV)
    for path in spec.read_only_binds:
        if os.path.exists(path):
            _bind(path, root, read_only=True)
    os.makedirs(f"{root}/proc")
    linux.mount("proc", f"{root}/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
    _build_dev(root)
    _mount_session_state(root, spec.uid, spec.uid)
    os.makedirs(f"{root}/workspace")
    linux.mount("overlay", f"{root}/workspace", "overlay", linux.MS_NOSUID | linux.MS_NODEV,
                f"lowerdir={lower},upperdir={upper},workdir={work}")
    # overlayfs holds its own references to the layers: the staging mounts can go
    for staged in os.listdir(f"{root}/.layers"):
        linux.umount(f"{root}/.layers/{staged}", linux.MNT_DETACH)
        os.rmdir(f"{root}/.layers/{staged}")
    os.rmdir(f"{root}/.layers")
    os.makedirs(f"{root}/.oldroot")
    linux.pivot_root(root, f"{root}/.oldroot")
    os.chdir("/")
    linux.umount("/.oldroot", linux.MNT_DETACH)
    os.rmdir("/.oldroot")
    # Nothing outside /workspace and /tmp is writable, root included.
    linux.mount("none", "/", None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV)


def _mount_session_state(root: str, uid: int, gid: int) -> None:
    """The shell session's state directory: a tmpfs of its own, owned by the sandbox's
    (host) uid, so a sandbox whose disk quota is full still runs commands (`rm` included)."""
    os.makedirs(f"{root}{SESSION_STATE_DIR}", exist_ok=True)
    linux.mount("tmpfs", f"{root}{SESSION_STATE_DIR}", "tmpfs", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC,
                f"size=1m,nr_inodes=64,mode=700,uid={uid},gid={gid}")


def _stage_idmapped_layers(spec: SandboxSpec, staging: str, keeper: int) -> tuple[str, str, str, str]:
    """Mount the template layers (`spec.lower`: one directory, or several joined by ':' as
    overlayfs takes them, topmost first) and the sandbox's layer directory (upper, work and
    tmp: one mount, as overlayfs needs upper and work on the same one) under `staging`,
    idmapped so that files owned on disk by SANDBOX_UID belong to this sandbox's uid.
    Returns the overlay's lowerdir, upperdir, workdir and the /tmp source. The host's
    /proc is still mounted here, where the keeper's (host) pid names it."""
    layer = os.path.commonpath([spec.upper, spec.work, spec.tmp])
    lowers = spec.lower.split(":")
    sources = {**{f"lower{i}": path for i, path in enumerate(lowers)}, "layer": layer}
    userns = idmap.map_user_namespace(keeper, idmap.identity_plus(SANDBOX_UID, spec.uid))
    try:
        for name, source in sources.items():
            os.makedirs(f"{staging}/{name}")
            idmap.idmapped_bind(source, f"{staging}/{name}", userns)
    finally:
        os.close(userns)
    return (":".join(f"{staging}/lower{i}" for i in range(len(lowers))),
            *(f"{staging}/layer/{os.path.relpath(p, layer)}" for p in (spec.upper, spec.work, spec.tmp)))


def _bind(host: str, root: str, read_only: bool) -> None:
    target = f"{root}{host}"
    if os.path.isdir(host):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Path(target).touch()
    linux.mount(host, target, None, linux.MS_BIND | linux.MS_REC)
    flags = linux.MS_REMOUNT | linux.MS_BIND | linux.MS_NOSUID | (linux.MS_RDONLY if read_only else 0)
    linux.mount("none", target, None, flags)


def _build_dev(root: str) -> None:
    dev = f"{root}/dev"
    os.makedirs(dev, exist_ok=True)
    linux.mount("tmpfs", dev, "tmpfs", linux.MS_NOSUID | linux.MS_NOEXEC, "size=64k,mode=755")
    for name in DEVICES:
        host = f"/dev/{name}"
        if os.path.exists(host) and stat.S_ISCHR(os.stat(host).st_mode):
            Path(f"{dev}/{name}").touch()
            linux.mount(host, f"{dev}/{name}", None, linux.MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(f"{dev}/shm", mode=0o1777)
    os.chmod(f"{dev}/shm", 0o1777)


def _restrict(spec: SandboxSpec) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (spec.open_files, spec.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    uid, gid, cwd = rootfs.identity(spec) if spec.image is not None else (spec.uid, spec.uid, "/workspace")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    # from uid 0 to non-zero: all capabilities drop; an image's root keeps them only in its
    # own user namespace, which owns none of the sandbox's other namespaces
    os.setresuid(uid, uid, uid)
    try:
        # The node agent's session keyring would otherwise be every sandbox's (the filter
        # below denies keyring calls; this is the second wall).
        linux.join_new_session_keyring()
    except OSError as err:
        if err.errno != errno.ENOSYS:  # a kernel without keyrings has nothing to share
            raise
    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    seccomp.install()
    os.chdir(cwd)


def _base_env() -> dict[str, str]:
    return {"PATH": BASE_PATH, "HOME": "/workspace", "LANG": "C.UTF-8", "TERM": "dumb", "USER": "sandbox"}


def _serve(channel: socket.socket, session: ShellSession, spec: SandboxSpec) -> None:
    stream = channel.makefile("rwb")
    protocol.send(stream, {"ready": True, "session": session.state()})
    table = ProcessTable()
    while True:
        try:
            request = protocol.receive(stream)
        except protocol.ProtocolError as err:
            protocol.send(stream, protocol.reply_error(err))
            continue
        if request is None:
            return
        try:
            result = _handle(request, session, table)
            protocol.send(stream, protocol.reply_ok(result))
        except OSError as err:
            message = _describe(err, spec, request.get("path"))
            kind = "PathNotFound" if err.errno == errno.ENOENT else "InvalidRequest"
            protocol.send(stream, {"ok": False, "error": {"type": kind, "message": message}})
        except LookupError as err:  # the process table's: no such pid
            protocol.send(stream, {"ok": False, "error": {"type": "ProcessNotFound", "message": str(err.args[0])}})
        except ValueError as err:  # the process table's: a request it cannot honour
            protocol.send(stream, {"ok": False, "error": {"type": "InvalidRequest", "message": str(err)}})
        except Exception as err:  # noqa: BLE001 - any failure of one request is reported, the loop goes on
            protocol.send(stream, {"ok": False, "error": {"type": "SandboxError", "message": f"{type(err).__name__}: {err}"}})


def _describe(err: OSError, spec: SandboxSpec, path: str | None) -> str:
    message = f"{err.filename or path or ''}: {err.strerror}"
    if err.errno in (errno.ENOSPC, errno.EDQUOT) and spec.disk_quota:
        message += (f" (this sandbox's quota is used up: template disk_quota={spec.disk_quota} bytes, "
                    f"inode_quota={spec.inode_quota} files)")
    return message


def _handle(request: dict[str, Any], session: ShellSession, table: ProcessTable) -> Any:
    op = request.get("op")
    if op in _TABLE_OPS:
        return _TABLE_OPS[op](request, session, table)
    if op in _FS_OPS:
        return _FS_OPS[op](request)
    if op == "run":
        return session.run(request["cmd"], float(request["timeout"]), request.get("cwd"), request.get("env"))
    if op == "read":
        with open(_resolve(request["path"]), "rb") as f:
            return {"data": base64.b64encode(f.read()).decode()}
    if op == "write":
        path = _resolve(request["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(request["data"]))
        return {"path": path}
    if op == "list":
        path = _resolve(request["path"])
        return [
            {"name": e.name, "type": "dir" if e.is_dir(follow_symlinks=False) else "file",
             "size": e.stat(follow_symlinks=False).st_size}
            for e in sorted(os.scandir(path), key=lambda e: e.name)
        ]
    if op == "ping":
        return {"pid": os.getpid(), "session": session.state()}
    raise protocol.ProtocolError(f"unknown op {op!r}")


# The node agent has checked each field's type (node_agent.py); paths resolve as above.
_TABLE_OPS = {
    "spawn": lambda r, session, table: table.spawn(
        r["cmd"], r["args"], {**session.env, **r["env"]}, _resolve(r["cwd"] or session.cwd), r["stdin"], r["tag"]),
    "poll": lambda r, session, table: table.poll(r["pid"], r["wait_s"]),
    "stdin": lambda r, session, table: table.write_stdin(r["pid"], base64.b64decode(r["data"])),
    "close_stdin": lambda r, session, table: table.close_stdin(r["pid"]),
    "signal": lambda r, session, table: table.signal(r["pid"], r["signal"]),
    "processes": lambda r, session, table: table.list(),
}
_FS_OPS = {
    "stat": lambda r: fs_ops.entry(_resolve(r["path"])),
    "entries": lambda r: fs_ops.entries(_resolve(r["path"]), r["depth"]),
    "make_dir": lambda r: fs_ops.make_dir(_resolve(r["path"])),
    "remove": lambda r: fs_ops.remove(_resolve(r["path"])),
    "move": lambda r: fs_ops.move(_resolve(r["path"]), _resolve(r["destination"])),
}


def _resolve(path: str) -> str:
    return path if path.startswith("/") else os.path.join(os.getcwd(), path)  # the init stays in its workspace
