"""Per-process memory figures from /proc: RSS, PSS and USS of a set of processes."""

from __future__ import annotations


def process_memory(pids: list[int]) -> dict[str, int]:
    """Sum of `smaps_rollup` over `pids`, in bytes; processes that exit meanwhile count 0."""
    total = {"rss": 0, "pss": 0, "uss": 0}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                text = f.read()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = {}
        for line in text.splitlines()[1:]:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * 1024
        total["rss"] += fields.get("Rss", 0)
        total["pss"] += fields.get("Pss", 0)
        total["uss"] += fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return total
