"""Exactly-once effects of a command across migration: the fence between a sandbox's
commands and its export.

When a command starts, the node snapshots the sandbox's writable layer (its whole file
state). A migration exports the snapshot, not the half-changed files, and the controller
re-runs the interrupted command on the target from it; the source's run of it is void
(its result is dropped, its files die with the source). So a command that increments a
counter then grows until OOM interception moves it still adds exactly one.

The fence makes "the source's result is delivered" and "the command is re-run on the
target" exclusive: once an export has begun, a command that finishes on the source waits
to learn whether the move happened (its result is then dropped) or was aborted (it is
delivered), and a new command waits before it starts.

Not covered: processes a command left running in the background (they are not re-run, and
their effects after the snapshot are lost with the source), effects outside the sandbox's
files (time passes twice; anything sent elsewhere is sent twice, though sandboxes have no
network), and a node agent dying in the instant between a command's last write and its
reply (the caller retries after recovery from the snapshot, so the files are right, but a
run the node completed and could not report is run again).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from venusrl.sandbox.errors import SandboxMigrated


class CommandFence:
    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self._changed = threading.Condition()
        self._running = False
        self._exporting = False
        self._moved_to: str | None = None

    @contextmanager
    def command(self, snapshot: Callable[[], None] | None, drop: Callable[[], None] | None) -> Iterator[None]:
        """One command (or file write) on the source: serialized with the others and with
        exports. `snapshot` saves the layer as the command finds it; `drop` discards it."""
        with self._changed:
            self._changed.wait_for(lambda: not (self._running or self._exporting))
            self._raise_if_moved()
            if snapshot is not None:
                snapshot()
            self._running = True
        try:
            yield
        except BaseException:
            self._finish(drop)
            raise
        self._finish(drop)

    def _finish(self, drop: Callable[[], None] | None) -> None:
        """Raises SandboxMigrated, replacing the command's own result or error, when an
        export that began meanwhile became a move: the target re-runs it."""
        with self._changed:
            self._running = False
            self._changed.notify_all()
            self._changed.wait_for(lambda: not self._exporting)
            self._raise_if_moved()
            if drop is not None:
                drop()

    def begin_export(self) -> bool:
        """Fence off new commands; True when one is in flight (export its snapshot)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._exporting)
            self._raise_if_moved()
            self._exporting = True
            return self._running

    def end_export(self, moved_to: str | None) -> None:
        """The move happened (`moved_to`) or was aborted (None): release the waiters."""
        with self._changed:
            self._exporting = False
            self._moved_to = moved_to
            self._changed.notify_all()

    def _raise_if_moved(self) -> None:
        if self._moved_to is not None:
            raise SandboxMigrated(f"sandbox {self.sandbox_id} migrated to node {self._moved_to}")
