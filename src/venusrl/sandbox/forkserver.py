"""The fork server every template zygote runs, and what an image zygote's fork does to
join a sandbox.

Standalone on purpose: stdlib only, Python 3.8 syntax and library. The host zygote
(zygote.py) imports it; an image template's zygote (image/zygote.py) runs this very file
with the image's own interpreter inside the image's root, where venusrl is not installed.

Wire (both zygotes): one SOCK_SEQPACKET control socket. The zygote sends
`{"ready": true, "pid": P}` once its setup is done (or `{"ready": false, "error": ...}`);
then each request is a JSON message with file descriptors attached, answered with
`{"pid": fork_pid}` (or `{"error": ...}`). End of the socket: the zygote exits.

Image zygote: the image's Python as root of the template's user namespace (image uids
0..65535 = the host's UID_BASE..), in its own PID, mount, network, IPC and UTS namespaces,
its root the image's. A sandbox's namespaces belong to that user namespace (sandbox_init.py
makes them so), which lets a fork of the zygote join them with no host privilege:
`join_sandbox` enters the sandbox's mount, network, IPC, UTS and PID namespaces, its
cgroups and then its own user namespace (where it holds nothing the sandbox does not),
and forks the sandbox's warm Python, a process of the sandbox like any other: it drops to
the image's User, installs the sandbox's seccomp filter, runs the template's python_start
and lives until the sandbox ends or the node agent lets go of it.
"""

import contextlib
import ctypes
import gc
import json
import os
import random
import resource
import signal
import socket
import struct
import sys
import traceback

MIN_PYTHON = (3, 8)
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
# The order a fork joins a sandbox's namespaces in: the user namespace last, as after it
# the fork holds capabilities only there (sandbox_init.py sends the fds in this order).
JOIN_ORDER = (("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET), ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS),
              ("pid", CLONE_NEWPID), ("user", CLONE_NEWUSER))

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The template's imports or setup failed; the message names the template."""


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def setns(fd, nstype):
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns({fd}, {nstype:#x})")


def prctl(option, arg, arg3=0):
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(arg3), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)), f"prctl({option}, {arg}, {arg3:#x})")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program):
    """Install a packed classic-BPF filter (8 bytes per instruction, seccomp.py builds it)
    on the calling thread; the caller has set no_new_privs."""
    code = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(code))
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


def reseed():
    """A fork copies the zygote's PRNG states; every sandbox must draw its own numbers."""
    random.seed(os.urandom(32))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))


def run_python_setup(name, modules, setup, namespace):
    """Import the template's modules and run its Python setup into `namespace`."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
            top = module.split(".")[0]
            namespace[top] = sys.modules[top]  # as `import a.b` binds `a`
        except ImportError as err:
            raise SetupError(f"template {name}: cannot import {module}: {err}") from None
    if setup:
        exec(compile(setup, f"<template {name} setup>", "exec"), namespace)


def run_python_start(name, start, namespace):
    if start:
        exec(compile(start, f"<template {name} start>", "exec"), namespace)


def recv_fds(sock, size, max_fds):
    """socket.recv_fds, which Python 3.8 lacks."""
    fds = []
    message, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_LEN(max_fds * 4))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[:len(data) // 4 * 4]))
    return message, fds


def serve(control, ready, become, fds_expected):
    """Report `ready`, then fork once per request; `become(request, fds)` runs in the fork
    and never returns. Returns when the control socket closes."""
    # Forks are reaped automatically; the collector must not dirty every shared object.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    gc.collect()
    gc.freeze()
    control.send(json.dumps(ready).encode())
    while True:
        message, fds = recv_fds(control, 1 << 20, fds_expected)
        if not message:
            return
        if len(fds) != fds_expected:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": f"expected {fds_expected} fds, got {len(fds)}"}).encode())
            continue
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            control.close()
            become(request, fds)
            os._exit(1)
        for fd in fds:
            os.close(fd)
        control.send(json.dumps({"pid": pid}).encode())


def join_sandbox(request, fds, template, namespace):
    """In a fork of the image zygote: fds are the sandbox's warm channel, then its namespaces
    in JOIN_ORDER, then its cgroup.procs files opened for writing. Never returns."""
    channel = socket.socket(fileno=fds[0])
    try:
        namespaces, cgroups = fds[1:1 + len(JOIN_ORDER)], fds[1 + len(JOIN_ORDER):]
        for index in range(len(JOIN_ORDER) - 1):  # zip(strict=) is Python 3.10+
            setns(namespaces[index], JOIN_ORDER[index][1])
        for procs in cgroups:
            os.write(procs, b"0")  # "0": the writer; the forked Python inherits its cgroups
        setns(namespaces[-1], CLONE_NEWUSER)
        for fd in fds[1:]:
            os.close(fd)
        if os.fork() != 0:  # the sandbox's PID namespace holds the fork's children, not the fork
            os._exit(0)
        _warm_python(request, channel, template, namespace)
    except BaseException:
        _send(channel, {"ready": False, "error": traceback.format_exc(limit=-3)})
    os._exit(1)


def _warm_python(request, channel, template, namespace):
    os.closerange(3, channel.fileno())
    os.closerange(channel.fileno() + 1, 65536)
    devnull = os.open("/dev/null", os.O_RDWR)  # the sandbox's /dev now
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    limit = request["open_files"]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setgroups([])
    os.setresgid(request["gid"], request["gid"], request["gid"])
    os.setresuid(request["uid"], request["uid"], request["uid"])
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    install_seccomp(bytes.fromhex(request["seccomp"]))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    reseed()
    if request["run_setup"]:
        run_python_setup(template["name"], template["python_modules"], template["python_setup"], namespace)
    run_python_start(template["name"], template["python_start"], namespace)
    _send(channel, {"ready": True, "pid": os.getpid()})
    while channel.recv(1):  # lives as long as the node agent holds the other end
        pass
    os._exit(0)


def _send(channel, message):
    with contextlib.suppress(OSError):  # the node agent may have given up on this sandbox
        channel.sendall(json.dumps(message).encode() + b"\n")


def main():
    """The image zygote: argv[1] is its config (template, share_pages, control_fd, pid)."""
    config = json.loads(sys.argv[1])
    control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=config["control_fd"])
    template = config["template"]
    namespace = {"__name__": "template_" + template["name"]}
    try:
        if sys.version_info < MIN_PYTHON:
            raise SetupError("template {}: the image's Python is {}.{}; python_* fields need {}.{}+".format(
                template["name"], sys.version_info[0], sys.version_info[1], *MIN_PYTHON))
        if config["share_pages"]:
            run_python_setup(template["name"], template["python_modules"], template["python_setup"], namespace)
    except BaseException as err:
        error = str(err) if isinstance(err, SetupError) else traceback.format_exc(limit=-3)
        control.send(json.dumps({"ready": False, "error": error}).encode())
        sys.exit(1)
    ready = {"ready": True, "pid": config["pid"], "python": sys.version.split()[0]}
    serve(control, ready, lambda request, fds: join_sandbox(request, fds, template, namespace),
          1 + len(JOIN_ORDER) + config["cgroups"])


if __name__ == "__main__":
    main()
