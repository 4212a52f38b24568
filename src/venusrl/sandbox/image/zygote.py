"""An image template's zygote: the image's own Python, warmed once per node.

Started by the node agent like the host zygote (inside the template's pool cgroup, config
JSON on stdin, SOCK_SEQPACKET control socket), this launcher unshares mount, PID,
network, IPC and UTS namespaces and forks the zygote, which builds its root from the
template's layers exactly as a sandbox does (rootfs.build_root, over a private upper of
its own), enters the image's user namespace as the image's root, and execs the image's
interpreter on forkserver.py (fed on its stdin). Nothing of venusrl runs after that exec:
the image's Python imports the template's modules, runs its setup and serves forks
(forkserver.main). The launcher stays as its parent so the node agent sees the zygote
live and exit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

from venusrl.sandbox import forkserver, linux
from venusrl.sandbox.image import rootfs

NAMESPACES = linux.CLONE_NEWNS | linux.CLONE_NEWNET | linux.CLONE_NEWIPC | linux.CLONE_NEWUTS | linux.CLONE_NEWPID


def main() -> None:
    config = json.loads(sys.stdin.readline())
    linux.unshare(NAMESPACES)
    pid_r, pid_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(pid_w)
        _become_zygote(config, int(os.read(pid_r, 32)))
    os.close(pid_r)
    os.write(pid_w, str(pid).encode())  # the zygote is PID 1 of its namespace: it learns its host pid here
    os.close(pid_w)
    os.close(config["control_fd"])  # the zygote's end alone: its exit closes the socket
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    sys.exit(code if code >= 0 else 1)


def _become_zygote(config: dict, host_pid: int) -> None:
    job = config["image_zygote"]
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        source = Path(forkserver.__file__).read_text()  # read now: the host's files are gone after the pivot
        from venusrl.sandbox.sandbox_init import _build_dev

        rootfs.build_root(SimpleNamespace(**job), _build_dev)  # ends in the image's user namespace
        linux.join_new_session_keyring()  # not the node agent's
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)  # the image's root: capabilities in the template's user namespace only
        linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
        os.chdir(job["image"]["workdir"])
        forkserver_config = {"template": config["template"], "share_pages": config["share_pages"],
                             "control_fd": config["control_fd"], "pid": host_pid, "cgroups": config["cgroups"]}
        # The source on stdin (Python reads all of it before running it), so the sandboxes'
        # `ps` shows a short command line for their warm Python.
        source_r, source_w = os.pipe()
        os.write(source_w, source.encode())  # well under a pipe's buffer
        os.close(source_w)
        os.dup2(source_r, 0)
        os.close(source_r)
        os.execve(job["python"], [job["python"], "-I", "-", json.dumps(forkserver_config)], job["env"])
    except BaseException:
        control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=config["control_fd"])
        control.send(json.dumps({"ready": False, "error": traceback.format_exc(limit=-3)}).encode())
    os._exit(1)


if __name__ == "__main__":
    main()
