"""What the report reads out of metrics records. A missing or non-finite field is left out,
so a run that logs fewer fields (or an older trainer) still gets a report."""

from __future__ import annotations

import math
import numbers
from collections import Counter, defaultdict
from typing import Any

Record = dict[str, Any]


def by_kind(records: list[Record]) -> dict[str, list[Record]]:
    kinds: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        kinds[record["kind"]].append(record)
    return kinds


def number(record: Record, field: str) -> float | None:
    value = record.get(field)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def with_fields(records: list[Record], *fields: str) -> list[Record]:
    """The records in which every one of `fields` is a finite number."""
    return [r for r in records if all(number(r, f) is not None for f in fields)]


def series(records: list[Record], x: str, y: str) -> tuple[list[float], list[float]]:
    rows = with_fields(records, x, y)
    return [r[x] for r in rows], [r[y] for r in rows]


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def groups_per_minute(steps: list[Record]) -> tuple[list[float], list[float]]:
    """(time_s, groups per minute) of each step record: its groups over its step_time_s, or
    over the time since the previous step record when step_time_s is absent."""
    times, rates = [], []
    previous = 0.0
    for record in with_fields(steps, "time_s"):
        time_s, groups = number(record, "time_s"), number(record, "groups")
        duration = number(record, "step_time_s") or time_s - previous
        if groups is not None and duration > 0:
            times.append(time_s)
            rates.append(60.0 * groups / duration)
        previous = time_s
    return times, rates


def version_span_counts(groups: list[Record]) -> dict[int, int]:
    """Trajectories per weight-version span (0, 1, 2, ...), over every group record."""
    counts: Counter[int] = Counter()
    for record in groups:
        spans = record.get("version_spans")
        if isinstance(spans, list):
            counts.update(int(s) for s in spans if isinstance(s, int) and not isinstance(s, bool))
    if not counts:
        return {}
    return {span: counts[span] for span in range(max(counts) + 1)}


def sandbox_series(samples: list[Record]) -> dict[str, list[Record]]:
    """Memory samples per node (sorted by node name), each with time_s and memory_bytes."""
    nodes: dict[str, list[Record]] = defaultdict(list)
    for record in with_fields(samples, "time_s", "memory_bytes"):
        nodes[str(record.get("node", "?"))].append(record)
    return dict(sorted(nodes.items()))
