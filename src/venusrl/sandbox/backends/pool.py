"""Template page pool: one zygote per (node, template), living in the template's pool cgroup.

An image template with python_* fields has a second one, the image zygote (image/zygote.py):
the host zygote forks its sandboxes' inits, the image zygote their warm Pythons."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path

from venusrl.sandbox.cgroups import Cgroup
from venusrl.sandbox.errors import TemplateError
from venusrl.sandbox.template import Template

log = logging.getLogger(__name__)

# Joins the pool cgroup before exec, so every page the zygote touches is charged to it.
_JOIN_AND_EXEC = 'py=$1; module=$2; shift 2; for f in "$@"; do echo $$ > "$f" || exit 1; done; exec "$py" -m "$module"'
HOST_ZYGOTE = "venusrl.sandbox.zygote"
IMAGE_ZYGOTE = "venusrl.sandbox.image.zygote"


class TemplatePool:
    def __init__(self, template: Template, cgroup: Cgroup, share_pages: bool, setup_timeout: float = 600.0,
                 module: str = HOST_ZYGOTE, extra: dict | None = None) -> None:
        """`module` is the zygote to start; `extra` goes into its config."""
        self.template = template
        self.cgroup = cgroup.create()
        self.share_pages = share_pages
        self._lock = threading.Lock()
        self.warm: TemplatePool | None = None  # an image template's image zygote (its Python state)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        procs = [str(d / "cgroup.procs") for d in cgroup.layout.dirs(cgroup.rel)]
        self.process = subprocess.Popen(
            ["/bin/sh", "-c", _JOIN_AND_EXEC, "sh", sys.executable, module, *procs],
            stdin=subprocess.PIPE,
            pass_fds=(theirs.fileno(),),
            close_fds=True,
        )
        control_fd = theirs.fileno()
        theirs.close()
        self._control = ours
        assert self.process.stdin is not None
        config = {"template": template.model_dump(mode="json"), "share_pages": share_pages, "control_fd": control_fd,
                  **(extra or {})}
        self.process.stdin.write(json.dumps(config).encode() + b"\n")
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
        self.pid = int(ready["pid"])  # the zygote's host pid
        self.python = ready.get("python")  # an image zygote's interpreter version
        log.info("template pool %s started: %s pid %d, share_pages=%s%s", template.name, module, self.pid,
                 share_pages, f", python {self.python}" if self.python else "")

    def fork(self, request: dict, fds: list[int]) -> int:
        """Fork once from the zygote (a sandbox's keeper, or an image zygote's warm Python,
        by `request`, with `fds` attached); returns the fork's pid in the zygote's view."""
        with self._lock:
            socket.send_fds(self._control, [json.dumps(request).encode()], fds)
            reply = self._control.recv(1 << 16)
        if not reply:
            raise TemplateError(f"template {self.template.name}: zygote exited")
        message = json.loads(reply)
        if "pid" not in message:
            raise TemplateError(f"template {self.template.name}: zygote refused: {message.get('error')}")
        return int(message["pid"])

    def alive(self) -> bool:
        """Both zygotes run (not merely their launchers: an image zygote's launcher exits
        only once it has reaped the zygote)."""
        return self.process.poll() is None and _running(self.pid) and (self.warm is None or self.warm.alive())

    def close(self) -> None:
        """Closing the control socket makes the zygote exit; its sandboxes die with it."""
        if self.warm is not None:
            self.warm.close()
        self._control.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.cgroup.remove()



PF_EXITING = 0x4


def _running(pid: int) -> bool:
    """Not exiting: a dying zygote loses its namespaces long before it is a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X") and not int(fields[6]) & PF_EXITING
