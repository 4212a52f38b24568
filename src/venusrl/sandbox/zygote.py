"""The per-node, per-template zygote: does the template setup once, then forks sandboxes.

Started by the node agent inside the template's pool cgroup, so the pages it touches
during setup (imported modules, the template's in-memory state) are charged once, to the
pool. Every sandbox is a fork of it: those pages stay shared until a sandbox writes one,
and then the kernel copies that page into the sandbox alone (and charges the sandbox).

Wire: the node agent writes the template JSON (with the number of the inherited control
socket's fd) on stdin; the fork server (forkserver.py) then takes one SandboxSpec JSON per
request with the sandbox's channel fd attached and answers `{"pid": keeper_pid}`. End of
that socket means the node agent is gone: the zygote exits and PDEATHSIG takes its
sandboxes down. An image template's Python state lives in the image zygote instead
(image/zygote.py): this one only forks the inits of its sandboxes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback

from venusrl.sandbox.forkserver import serve
from venusrl.sandbox.sandbox_init import become_sandbox
from venusrl.sandbox.spec import SandboxSpec
from venusrl.sandbox.template import Template, run_python_setup


def main() -> None:
    config = json.loads(sys.stdin.readline())
    template = Template.model_validate(config["template"])
    control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=config["control_fd"])
    namespace: dict = {"__name__": f"template_{template.name}"}
    try:
        if config["share_pages"] and template.image is None:
            run_python_setup(template, namespace)
    except BaseException:
        control.send(json.dumps({"ready": False, "error": traceback.format_exc(limit=3)}).encode())
        sys.exit(1)

    def become(request: dict, fds: list[int]) -> None:
        become_sandbox(SandboxSpec.from_json(request), socket.socket(fileno=fds[0]), template, namespace)

    serve(control, {"ready": True, "pid": os.getpid()}, become, fds_expected=1)


if __name__ == "__main__":
    main()
