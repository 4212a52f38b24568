"""The per-node, per-template zygote: does the template setup once, then forks sandboxes.

Started by the node agent inside the template's pool cgroup, so the pages it touches
during setup (imported modules, the template's in-memory state) are charged once, to the
pool. Every sandbox is a fork of it: those pages stay shared until a sandbox writes one,
and then the kernel copies that page into the sandbox alone (and charges the sandbox).

Wire: the node agent writes the template JSON (with the number of the inherited control
socket's fd) on stdin and talks on that SOCK_SEQPACKET socket: each request is a SandboxSpec JSON with the sandbox's channel fd
attached; each reply is `{"pid": keeper_pid}`. End of that socket means the node agent is
gone: the zygote exits and PDEATHSIG takes its sandboxes down.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import traceback

from venusrl.sandbox.sandbox_init import become_sandbox
from venusrl.sandbox.spec import SandboxSpec
from venusrl.sandbox.template import Template, run_python_setup


def main() -> None:
    config = json.loads(sys.stdin.readline())
    template = Template.model_validate(config["template"])
    control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=config["control_fd"])
    namespace: dict = {"__name__": f"template_{template.name}"}
    try:
        if config["share_pages"]:
            run_python_setup(template, namespace)
    except BaseException:
        control.send(json.dumps({"ready": False, "error": traceback.format_exc(limit=3)}).encode())
        sys.exit(1)
    # Keepers are reaped automatically; the collector must not dirty every shared object.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    gc.collect()
    gc.freeze()
    control.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1 << 20, 1)
        if not message:
            return
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            control.send(b"{\"error\": \"expected exactly one channel fd\"}")
            continue
        spec = SandboxSpec.from_json(json.loads(message))
        channel = socket.socket(fileno=fds[0])
        pid = os.fork()
        if pid == 0:
            control.close()
            become_sandbox(spec, channel, template, namespace)
        channel.close()
        control.send(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    main()
