"""The node agent's checks of the process-table and filesystem operations (processes.py,
fs_ops.py) before they reach a sandbox's init: each field's type, so the init only ever
sees well-formed requests and a bad one is an InvalidRequest naming the field."""

from __future__ import annotations

import signal
from typing import Any

from venusrl.sandbox.errors import InvalidRequest

MAX_DEPTH = 32
SIGNALS = {int(signal.SIGTERM), int(signal.SIGKILL), int(signal.SIGINT), int(signal.SIGHUP)}


def _str(request: dict[str, Any], name: str, optional: bool = False) -> str | None:
    value = request.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise InvalidRequest(f"{name}: expected a non-empty string without NUL, got {value!r}")
    return value


def _int(request: dict[str, Any], name: str, low: int, high: int) -> int:
    value = request.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidRequest(f"{name}: expected an integer in [{low}, {high}], got {value!r}")
    return value


def _strings(request: dict[str, Any], name: str) -> list[str]:
    value = request.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise InvalidRequest(f"{name}: expected a list of strings, got {value!r}")
    return value


def _env(request: dict[str, Any]) -> dict[str, str]:
    value = request.get("env") or {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and k and "=" not in k and "\0" not in k and isinstance(v, str) and "\0" not in v
            for k, v in value.items()):
        raise InvalidRequest(f"env: expected a mapping of variable names to strings, got {value!r}")
    return value


def _bool(request: dict[str, Any], name: str) -> bool:
    value = request.get(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name}: expected true or false, got {value!r}")
    return value


def _number(request: dict[str, Any], name: str, high: float) -> float:
    value = request.get(name, 0.0)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= high:
        raise InvalidRequest(f"{name}: expected a number of seconds in [0, {high}], got {value!r}")
    return float(value)


def _pid(request: dict[str, Any]) -> int:
    return _int(request, "pid", 1, 1 << 22)


_CHECKS = {
    "spawn": lambda r: {"cmd": _str(r, "cmd"), "args": _strings(r, "args"), "env": _env(r),
                        "cwd": _str(r, "cwd", optional=True), "stdin": _bool(r, "stdin"),
                        "tag": _str(r, "tag", optional=True)},
    "poll": lambda r: {"pid": _pid(r), "wait_s": _number(r, "wait_s", 1.0)},
    "stdin": lambda r: {"pid": _pid(r), "data": _str(r, "data")},
    "close_stdin": lambda r: {"pid": _pid(r)},
    "signal": lambda r: {"pid": _pid(r), "signal": _signal(r)},
    "processes": lambda r: {},
    "stat": lambda r: {"path": _str(r, "path")},
    "entries": lambda r: {"path": _str(r, "path"), "depth": _int(r, "depth", 1, MAX_DEPTH)},
    "make_dir": lambda r: {"path": _str(r, "path")},
    "remove": lambda r: {"path": _str(r, "path")},
    "move": lambda r: {"path": _str(r, "path"), "destination": _str(r, "destination")},
}

OPS = frozenset(_CHECKS)


def _signal(request: dict[str, Any]) -> int:
    value = request.get("signal")
    if value not in SIGNALS or isinstance(value, bool):
        raise InvalidRequest(f"signal: expected one of {sorted(SIGNALS)}, got {value!r}")
    return int(value)  # type: ignore[arg-type]


def checked(request: dict[str, Any]) -> dict[str, Any]:
    """The call to send to the init: the op and its checked fields, nothing else."""
    op = request["op"]
    return {"op": op, **_CHECKS[op](request)}
