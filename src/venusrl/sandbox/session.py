"""The stateful shell session inside a sandbox.

Each command runs in a fresh `bash` that starts from the session's cwd and exported
environment and reports both back when it exits, so `cd` and `export` persist between
calls exactly as in one interactive shell, and the session state is plain data the node
agent can save and move. Commands are serialized: one shell, one command at a time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from typing import Any

from venusrl.sandbox.processes import reap_orphans

MAX_OUTPUT_BYTES = 4 << 20  # per stream; the tail is kept

# Runs the command, then (from the EXIT trap, so `exit N` is covered too) writes the final
# cwd and environment NUL-separated to a file only the session reads. Command processes
# raise their OOM score to the maximum (raising needs no privilege, lowering the init's
# would), so a sandbox over its limit loses the command, never its init.
_WRAPPER = r"""
__venus_state=$__VENUS_STATE_FILE; unset __VENUS_STATE_FILE
echo 1000 > /proc/self/oom_score_adj 2>/dev/null
trap '__venus_rc=$?; { printf "%s\0" "$PWD"; env -0; } > "$__venus_state" 2>/dev/null; exit $__venus_rc' EXIT
eval "$1"
"""

_SHELL_NOISE = {"_", "SHLVL", "PWD", "OLDPWD"}


class ShellSession:
    def __init__(self, cwd: str, env: dict[str, str], state_dir: str = "/tmp") -> None:
        self.cwd = cwd
        self.env = dict(env)
        self.state_dir = state_dir  # off the sandbox's disk quota: a full disk must not stop `rm`

    def state(self) -> dict[str, Any]:
        return {"cwd": self.cwd, "env": dict(self.env)}

    def run(self, cmd: str, timeout: float, cwd: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
        extra = dict(env or {})
        fd, state_file = tempfile.mkstemp(prefix=".venus-session-", dir=self.state_dir)
        os.close(fd)
        run_env = {**self.env, **extra, "__VENUS_STATE_FILE": state_file, "PWD": cwd or self.cwd}
        started = time.monotonic()
        timed_out = False
        try:
            proc = subprocess.Popen(
                ["/bin/bash", "-c", _WRAPPER, "venus", cmd],
                cwd=cwd or self.cwd,
                env=run_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except (FileNotFoundError, NotADirectoryError) as err:
            os.unlink(state_file)
            return {"exit_code": 127, "stdout": "", "stderr": f"cannot start in {cwd or self.cwd}: {err}\n",
                    "timed_out": False, "duration_s": 0.0, **self.state()}
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_all_but_self()
            out, err = proc.communicate()
        reap_orphans()
        self._load_state(state_file, extra)
        return {
            "exit_code": proc.returncode if not timed_out else -signal.SIGKILL,
            "stdout": _tail(out),
            "stderr": _tail(err),
            "timed_out": timed_out,
            "duration_s": time.monotonic() - started,
            **self.state(),
        }

    def _load_state(self, state_file: str, extra: dict[str, str]) -> None:
        try:
            with open(state_file, "rb") as f:
                raw = f.read()
        finally:
            os.unlink(state_file)
        if not raw:
            return  # killed before its EXIT trap: the session is as it was
        cwd, *pairs = raw.decode(errors="replace").split("\0")
        env = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if sep and key not in _SHELL_NOISE:
                env[key] = value
        # Per-call variables last for that call only, unless the command changed them.
        for key, value in extra.items():
            if env.get(key) == value:
                if key in self.env:
                    env[key] = self.env[key]
                else:
                    env.pop(key)
        self.cwd, self.env = cwd, env


def _tail(data: bytes) -> str:
    return data[-MAX_OUTPUT_BYTES:].decode(errors="replace")


def kill_all_but_self() -> None:
    """SIGKILL every other process of this PID namespace: a timed-out command's whole tree,
    including children that changed session or were orphaned to init."""
    me = os.getpid()
    if me != 1:  # outside a sandbox's PID namespace this would signal the whole host
        raise RuntimeError("kill_all_but_self runs only as PID 1 of a sandbox's PID namespace")
    for _ in range(50):
        victims = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        reap_orphans()
        time.sleep(0.005)
