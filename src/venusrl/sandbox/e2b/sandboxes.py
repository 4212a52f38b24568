"""The E2B view of each sandbox: its template id, access token, metadata, environment and
end of life. The sandboxes themselves live on the node agents (SandboxController); this
table holds what E2B's API adds on top, and which sandboxes have outlived their timeout."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

DEFAULT_TIMEOUT_S = 300  # E2B's default sandbox lifetime
MAX_TIMEOUT_S = 24 * 3600


@dataclass
class E2BSandbox:
    sandbox_id: str
    template_id: str
    template: str  # our template's name
    token: str
    started_at: datetime
    end_at: datetime
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    paused: bool = False

    def extend(self, now: datetime, timeout_s: int) -> None:
        self.end_at = now + timedelta(seconds=timeout_s)


class SandboxTable:
    """Thread-safe: REST handlers run on worker threads."""

    def __init__(self) -> None:
        self._records: dict[str, E2BSandbox] = {}
        self._lock = threading.Lock()

    def add(self, record: E2BSandbox) -> None:
        with self._lock:
            self._records[record.sandbox_id] = record

    def get(self, sandbox_id: str) -> E2BSandbox | None:
        with self._lock:
            return self._records.get(sandbox_id)

    def pop(self, sandbox_id: str) -> E2BSandbox | None:
        with self._lock:
            return self._records.pop(sandbox_id, None)

    def all(self) -> list[E2BSandbox]:
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.started_at)

    def expired(self, now: datetime) -> list[str]:
        with self._lock:
            return [r.sandbox_id for r in self._records.values() if r.end_at <= now]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
