"""Running a test's step in a forked child: for what a process cannot undo (a seccomp
filter, a new mount namespace) and must not do to the test runner."""

from __future__ import annotations

import json
import os
from collections.abc import Callable


def in_child(step: Callable[[], dict]) -> dict:
    """step() in a forked child; its JSON-able result, or an AssertionError with the
    child's exception."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read)
            result = step()
        except BaseException as err:  # noqa: BLE001 - reported to the parent, which fails the test
            result, code = {"error": repr(err)}, 1
        finally:
            try:
                os.write(write, json.dumps(result).encode())
            finally:
                os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        result = json.loads(f.read() or '{"error": "the child wrote nothing"}')
    os.waitpid(pid, 0)
    assert "error" not in result, result
    return result
