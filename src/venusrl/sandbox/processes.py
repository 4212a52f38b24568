"""Commands that run concurrently inside a sandbox: the process table of its init.

The shell session (session.py) runs one command at a time and answers when it ends. The
E2B protocol needs more: start a process and return at once, read its output as it comes,
write its stdin, signal it, list it. The init keeps those processes here, each in its own
process group, with pipes it drains only when asked (`poll`), so a process that writes
faster than its reader is slowed by its pipe, never buffered without bound here.

Runs as PID 1 of the sandbox's namespace, so it reaps every zombie there (`reap_orphans`, also
run by the session): an unreaped orphan would hold its pid against the sandbox's pids limit
forever. The status of one of this table's processes is kept for it in `EXITED`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

READ_CHUNK = 64 << 10
MAX_POLL_BYTES = 1 << 20  # per stream per poll: one reply stays small
MAX_WAIT_S = 1.0  # a poll holds the sandbox's channel at most this long

WATCHED: set[int] = set()  # pids of this table: the reaper keeps their status
EXITED: dict[int, int] = {}  # pid -> wait status of a watched pid, once reaped


@dataclass
class _Process:
    popen: subprocess.Popen
    config: dict[str, Any]
    tag: str | None
    streams: dict[str, int] = field(default_factory=dict)  # name -> read fd, until EOF
    status: int | None = None  # wait status once reaped


class ProcessTable:
    def __init__(self) -> None:
        self._processes: dict[int, _Process] = {}

    def spawn(self, cmd: str, args: list[str], env: dict[str, str], cwd: str, stdin: bool,
              tag: str | None) -> dict[str, Any]:
        reap_orphans()  # what earlier commands left behind must not hold pids this one needs
        popen = subprocess.Popen(
            [cmd, *args], cwd=cwd, env=env, start_new_session=True,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        WATCHED.add(popen.pid)
        streams = {}
        for name, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
            assert pipe is not None
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            streams[name] = fd
        config = {"cmd": cmd, "args": list(args), "envs": env, "cwd": cwd}
        self._processes[popen.pid] = _Process(popen, config, tag, streams)
        return {"pid": popen.pid}

    def _get(self, pid: Any) -> _Process:
        process = self._processes.get(pid) if isinstance(pid, int) else None
        if process is None:
            raise LookupError(f"pid: no process {pid!r} in this sandbox")
        return process

    def poll(self, pid: int, wait_s: float) -> dict[str, Any]:
        """Output since the last poll, and the exit status once the process has exited and
        its pipes are drained. Waits up to `wait_s` for something to report."""
        process = self._get(pid)
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
        out: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        while True:
            self._drain(process, out)
            if process.status is None and self._reap(process):
                # What it wrote before exiting is in its pipes now; later output would come
                # from descendants that outlived it (`sleep 100 &` keeps the pipes open).
                self._drain(process, out)
                if max(len(data) for data in out.values()) < MAX_POLL_BYTES:
                    process.streams.clear()
            elif process.status is not None and max(len(data) for data in out.values()) < MAX_POLL_BYTES:
                process.streams.clear()
            done = process.status is not None and not process.streams
            left = deadline - time.monotonic()
            if out["stdout"] or out["stderr"] or done or left <= 0:
                break
            fds = list(process.streams.values())
            if fds:
                select.select(fds, [], [], min(left, 0.05))
            else:  # pipes closed, process not yet reaped: it is exiting
                time.sleep(min(left, 0.002))
        reply: dict[str, Any] = {name: base64.b64encode(bytes(data)).decode() for name, data in out.items()}
        reply["exited"] = done
        if done:
            reply.update(_describe_status(process.status))  # type: ignore[arg-type]
            self._forget(pid)
        return reply

    def _drain(self, process: _Process, out: dict[str, bytearray]) -> None:
        for name, fd in list(process.streams.items()):
            while len(out[name]) < MAX_POLL_BYTES:
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    break
                if not chunk:  # EOF: every writer has closed it
                    del process.streams[name]
                    break
                out[name] += chunk

    def _reap(self, process: _Process) -> bool:
        """Collect the exit status; True once the process has exited."""
        pid = process.popen.pid
        reap_orphans()
        status = EXITED.pop(pid, None)
        if status is None:
            return False
        process.status = status
        process.popen.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
        return True

    def _forget(self, pid: int) -> None:
        process = self._processes.pop(pid)
        WATCHED.discard(pid)
        for pipe in (process.popen.stdin, process.popen.stdout, process.popen.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def write_stdin(self, pid: int, data: bytes) -> None:
        process = self._get(pid)
        if process.popen.stdin is None or process.popen.stdin.closed:
            raise ValueError(f"stdin: process {pid} was started without stdin, or it is closed")
        try:
            process.popen.stdin.write(data)
            process.popen.stdin.flush()
        except BrokenPipeError:
            raise ValueError(f"stdin: process {pid} no longer reads its stdin") from None

    def close_stdin(self, pid: int) -> None:
        process = self._get(pid)
        if process.popen.stdin is not None and not process.popen.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                process.popen.stdin.close()

    def signal(self, pid: int, signum: int) -> None:
        """The process, every descendant it still parents (found before any dies, so one that
        left the group with `setsid` is reached too) and its whole process group (which
        holds the children of subshells that already exited)."""
        self._get(pid)
        for target in (*_descendants(pid), pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signum)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signum)

    def list(self) -> list[dict[str, Any]]:
        return [{"pid": pid, "tag": p.tag, "config": p.config} for pid, p in self._processes.items()
                if p.status is None]


def reap_orphans() -> None:
    """As PID 1 of the sandbox, collect every zombie (processes reparented to it included);
    the status of one the process table started is kept for it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in WATCHED:
            EXITED[pid] = status


def _descendants(root: int) -> list[int]:
    """Descendants of `root` by parent links in this PID namespace's /proc, deepest last."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it exited meanwhile
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])  # after the command, which may hold spaces
        children.setdefault(ppid, []).append(int(name))
    found, frontier = [], [root]
    while frontier:
        below = [child for parent in frontier for child in children.get(parent, [])]
        found.extend(below)
        frontier = below
    return found


def _describe_status(status: int) -> dict[str, Any]:
    """Exit code and status text as envd reports them (Go's ProcessState): a process killed
    by a signal has exit code -1 and the status `signal: killed`."""
    if os.WIFSIGNALED(status):
        name = (signal.strsignal(os.WTERMSIG(status)) or "unknown").lower()  # Go's names: killed, terminated
        return {"exit_code": -1, "normal_exit": False, "status": f"signal: {name}"}
    code = os.WEXITSTATUS(status)
    return {"exit_code": code, "normal_exit": True, "status": f"exit status {code}"}
