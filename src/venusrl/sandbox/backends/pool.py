"""Template page pool: one zygote per (node, template), living in the template's pool cgroup."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading

from venusrl.sandbox.cgroups import Cgroup
from venusrl.sandbox.errors import TemplateError
from venusrl.sandbox.spec import SandboxSpec
from venusrl.sandbox.template import Template

log = logging.getLogger(__name__)

# Joins the pool cgroup before exec, so every page the zygote touches is charged to it.
_JOIN_AND_EXEC = 'py=$1; shift; for f in "$@"; do echo $$ > "$f" || exit 1; done; exec "$py" -m venusrl.sandbox.zygote'


class TemplatePool:
    def __init__(self, template: Template, cgroup: Cgroup, share_pages: bool, setup_timeout: float = 600.0) -> None:
        self.template = template
        self.cgroup = cgroup.create()
        self.share_pages = share_pages
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        procs = [str(d / "cgroup.procs") for d in cgroup.layout.dirs(cgroup.rel)]
        self.process = subprocess.Popen(
            ["/bin/sh", "-c", _JOIN_AND_EXEC, "sh", sys.executable, *procs],
            stdin=subprocess.PIPE,
            pass_fds=(theirs.fileno(),),
            close_fds=True,
        )
        control_fd = theirs.fileno()
        theirs.close()
        self._control = ours
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"template": template.model_dump(mode="json"), "share_pages": share_pages, "control_fd": control_fd}).encode() + b"\n")
        self.process.stdin.close()
        ours.settimeout(setup_timeout)
        try:
            ready = json.loads(ours.recv(1 << 16) or b'{"ready": false, "error": "zygote exited during setup"}')
        except TimeoutError:
            ready = {"ready": False, "error": f"setup took longer than {setup_timeout}s"}
        if not ready.get("ready"):
            self.close()
            raise TemplateError(f"template {template.name}: zygote setup failed: {ready.get('error')}")
        ours.settimeout(30.0)
        log.info("template pool %s started: zygote pid %d, share_pages=%s", template.name, self.process.pid, share_pages)

    def fork(self, spec: SandboxSpec, channel: socket.socket) -> int:
        """Fork one sandbox from the zygote; returns the pid of its keeper (the fork)."""
        with self._lock:
            socket.send_fds(self._control, [json.dumps(spec.to_json()).encode()], [channel.fileno()])
            reply = self._control.recv(1 << 16)
        if not reply:
            raise TemplateError(f"template {self.template.name}: zygote exited")
        message = json.loads(reply)
        if "pid" not in message:
            raise TemplateError(f"template {self.template.name}: zygote refused: {message.get('error')}")
        return int(message["pid"])

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Closing the control socket makes the zygote exit; its sandboxes die with it."""
        self._control.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.cgroup.remove()

