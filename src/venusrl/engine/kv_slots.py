"""Page allocator over integer KV slot ids (pure: the runner owns the tensors).

Slot ``s`` lives in page ``s // page_size``; a page holds the slots
``page * page_size .. page * page_size + page_size - 1``. Memory is handed out and
returned in whole pages, so a request's private KV always starts at a page boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class PageAllocator:
    """Free list of KV pages. Every page is either free or owned by exactly one holder."""

    def __init__(self, capacity_tokens: int, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if capacity_tokens < page_size:
            raise ValueError(f"capacity {capacity_tokens} holds no page of {page_size} tokens")
        self.page_size = page_size
        self.num_pages = capacity_tokens // page_size
        # LIFO free list: a freed page is reused first, which keeps the working set small.
        self._free: list[int] = list(range(self.num_pages - 1, -1, -1))
        self._is_free = bytearray(b"\x01") * self.num_pages

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` tokens starting at a page boundary."""
        return -(-num_tokens // self.page_size)

    def alloc(self, num_pages: int) -> list[int]:
        """Take ``num_pages`` pages; returns their page ids. Raises if too few are free."""
        if num_pages < 0:
            raise ValueError(f"cannot allocate {num_pages} pages")
        if num_pages > len(self._free):
            raise MemoryError(f"{num_pages} pages requested, {len(self._free)} free")
        pages = self._free[len(self._free) - num_pages :]
        del self._free[len(self._free) - num_pages :]
        for page in pages:
            self._is_free[page] = 0
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Return pages. Freeing a free page or an unknown page id is an error, and then
        nothing is freed."""
        pages = list(pages)
        if not pages:
            return
        if min(pages) < 0 or max(pages) >= self.num_pages:
            bad = next(p for p in pages if not 0 <= p < self.num_pages)
            raise ValueError(f"page {bad} out of range [0, {self.num_pages})")
        is_free = self._is_free
        for i, page in enumerate(pages):
            if is_free[page]:
                for undone in pages[:i]:
                    is_free[undone] = 0
                raise ValueError(f"double free of page {page}")
            is_free[page] = 1
        self._free.extend(pages)

    def page_slots(self, page: int) -> range:
        start = page * self.page_size
        return range(start, start + self.page_size)

    def slots_of(self, pages: Sequence[int]) -> list[int]:
        """The slots of ``pages``, in order."""
        if self.page_size == 1:
            return list(pages)
        return [slot for page in pages for slot in self.page_slots(page)]

    def pages_of(self, slots: Sequence[int]) -> list[int]:
        """Page ids of page-aligned private slots (a run of whole pages, the last maybe partial)."""
        if self.page_size == 1:
            return list(slots)
        return [slot // self.page_size for slot in slots[:: self.page_size]]

    def check_integrity(self, used_pages: Iterable[int]) -> None:
        """Every page is free or in ``used_pages``, never both and never twice."""
        seen = bytearray(self.num_pages)
        for page in used_pages:
            if seen[page]:
                raise AssertionError(f"page {page} held twice")
            if self._is_free[page]:
                raise AssertionError(f"page {page} is both free and held")
            seen[page] = 1
        if len(set(self._free)) != len(self._free):
            raise AssertionError("free list holds a page twice")
        leaked = [p for p in range(self.num_pages) if not seen[p] and not self._is_free[p]]
        if leaked:
            raise AssertionError(f"leaked pages: {leaked[:10]}")
