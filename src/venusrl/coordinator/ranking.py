"""Groups kept in ascending key order; the first k are the critical (HIGH) groups."""

from __future__ import annotations

from bisect import bisect_left, insort


class GroupRanking:
    """A sorted list of (key, seq, group_id) plus the set of the first k group ids.

    `seq` breaks ties by admission order, so the order is total and deterministic. The
    critical set is maintained incrementally: one insertion or deletion moves at most one
    group across position k, so an update costs O(log n) search + O(n) memmove, never O(k).
    `changed` says whether the set differs from what `critical()` last returned.
    """

    __slots__ = ("_entries", "_entry_of", "_k", "_high", "_added", "_removed")

    def __init__(self) -> None:
        self._entries: list[tuple[float, int, int]] = []
        self._entry_of: dict[int, tuple[float, int, int]] = {}
        self._k = 0
        self._high: set[int] = set()
        self._added: set[int] = set()  # since the last critical()
        self._removed: set[int] = set()

    @property
    def changed(self) -> bool:
        return bool(self._added or self._removed)

    def critical(self) -> frozenset[int]:
        """The group ids at positions 0..k-1."""
        self._added.clear()
        self._removed.clear()
        return frozenset(self._high)

    def key(self, group_id: int) -> float | None:
        entry = self._entry_of.get(group_id)
        return None if entry is None else entry[0]

    def order(self) -> list[int]:
        return [entry[2] for entry in self._entries]

    def set_critical_count(self, k: int) -> None:
        if k < self._k:
            for entry in self._entries[k : self._k]:
                self._leave(entry[2])
        elif k > self._k:
            for entry in self._entries[self._k : k]:
                self._enter(entry[2])
        self._k = k

    def upsert(self, group_id: int, key: float, seq: int) -> None:
        entry = (key, seq, group_id)
        old = self._entry_of.get(group_id)
        if old == entry:
            return
        if old is not None:
            self._delete(old)
        insort(self._entries, entry)
        self._entry_of[group_id] = entry
        if bisect_left(self._entries, entry) < self._k:
            self._enter(group_id)
            if len(self._entries) > self._k:  # the entry pushed to position k leaves
                self._leave(self._entries[self._k][2])

    def remove(self, group_id: int) -> None:
        old = self._entry_of.pop(group_id, None)
        if old is not None:
            self._delete(old)

    def _delete(self, entry: tuple[float, int, int]) -> None:
        index = bisect_left(self._entries, entry)
        del self._entries[index]
        if index < self._k:
            self._leave(entry[2])
            if len(self._entries) >= self._k:  # the entry pulled up to position k-1 enters
                self._enter(self._entries[self._k - 1][2])

    def _enter(self, group_id: int) -> None:
        self._high.add(group_id)
        if group_id in self._removed:
            self._removed.discard(group_id)
        else:
            self._added.add(group_id)

    def _leave(self, group_id: int) -> None:
        self._high.discard(group_id)
        if group_id in self._added:
            self._added.discard(group_id)
        else:
            self._removed.add(group_id)
