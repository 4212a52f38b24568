"""Cold-start growth profiles per template, learned from the sandboxes a node starts.

A profile keeps the last observations of how much memory a sandbox of the template held
when its cold start ended; the estimate is their maximum (conservative: Algorithm 1
reserves headroom from it). Profiles are kept apart for shared and private page modes,
whose cold starts differ by the template's whole setup.
"""

from __future__ import annotations

import json
from pathlib import Path

from venusrl.durable import write_atomic

KEEP = 16


class ColdStartProfiles:
    def __init__(self, observations: dict[str, list[float]] | None = None) -> None:
        self.observations: dict[str, list[float]] = {k: list(v) for k, v in (observations or {}).items()}

    @staticmethod
    def key(template: str, share_pages: bool) -> str:
        return f"{template}:{'shared' if share_pages else 'private'}"

    def observe(self, key: str, grown_bytes: float) -> None:
        if grown_bytes < 0:
            raise ValueError(f"grown_bytes: must be >= 0, got {grown_bytes}")
        history = self.observations.setdefault(key, [])
        history.append(float(grown_bytes))
        del history[:-KEEP]

    def estimate(self, key: str, default: float) -> float:
        """Expected cold-start growth; `default` until the template has been seen."""
        history = self.observations.get(key)
        return max(history) if history else default

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.observations))

    @classmethod
    def load(cls, path: Path) -> ColdStartProfiles:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (json.JSONDecodeError, OSError) as err:
            raise ValueError(f"{path}: unreadable profile file ({err})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: profile file must hold a JSON object")
        return cls({str(k): [float(x) for x in v] for k, v in data.items()})
