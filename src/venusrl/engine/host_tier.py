"""The host-memory tier of the KV cache (pure: slots are ints; the runner copies the KV).

KV the device pool evicts is saved to host pages, and a request whose context continues
past its device-cached prefix into host-cached KV loads that part back instead of
recomputing it (SGLang's HiCache does the same under LRU). What reaches the host is what the
device tier chose to evict, so with the trajectory-aware tiers it is the KV of trajectories
that wait longest or have ended. The host tier itself is a radix tree under plain LRU: it
deduplicates shared prefixes (a group's prompt is saved once) and evicts whole leaves.

Invariant: a host node pinned as the source of a load this step is not evicted before the
runner has copied it (pins last until `unpin_all`, called when the batch is handed out).
"""

from __future__ import annotations

from collections.abc import Sequence

from venusrl.engine.batch import KVCopy
from venusrl.engine.kv_slots import PageAllocator
from venusrl.engine.radix_cache import RadixCache, RadixNode, Tier


class HostTier:
    def __init__(self, capacity_tokens: int, page_size: int) -> None:
        self.allocator = PageAllocator(capacity_tokens, page_size)
        self.cache = RadixCache(self.allocator, "lru")
        self.saved_tokens = 0
        self._pinned: list[RadixNode] = []

    @property
    def used_tokens(self) -> int:
        return self.allocator.capacity_tokens - self.allocator.free_pages * self.allocator.page_size

    def save(self, tokens: Sequence[int], device_slots: Sequence[int]) -> KVCopy | None:
        """Keep page-aligned `tokens`, whose KV is at `device_slots`, in host memory, evicting
        least recently used host KV for room. Returns the copy to make, or None when the host
        already holds them all or cannot make room."""
        match = self.cache.match_prefix(tokens)
        have = len(match.slots)
        need = self.allocator.pages_for(len(tokens) - have)
        if need == 0:
            return None
        self.cache.lock(match.node)  # the prefix being extended survives the eviction
        shortfall = need - self.allocator.free_pages
        if shortfall > 0 and self.cache.evictable_tokens(Tier.HIGH_REF) >= shortfall * self.allocator.page_size:
            self.cache.evict(shortfall * self.allocator.page_size, Tier.HIGH_REF)
        self.cache.unlock(match.node)
        if self.allocator.free_pages < need:
            return None
        host_slots = self.allocator.slots_of(self.allocator.alloc(need))
        self.cache.insert(tokens, match.slots + host_slots)
        self.saved_tokens += len(host_slots)
        return KVCopy(to_host=True, device_slots=list(device_slots[have:]), host_slots=host_slots)

    def continuation(self, tokens: Sequence[int], device_cached: int) -> list[int]:
        """Host slots of the host-cached prefix of `tokens` past its first `device_cached`
        tokens (page-aligned), pinned until `unpin_all`; empty when the host has no more."""
        match = self.cache.match_prefix(tokens)
        if len(match.slots) <= device_cached:
            return []
        self.cache.lock(match.node)
        self._pinned.append(match.node)
        return match.slots[device_cached:]

    def unpin_all(self) -> None:
        for node in self._pinned:
            self.cache.unlock(node)
        self._pinned.clear()

    def drop_all(self) -> None:
        """Forget everything (new weights make the KV stale)."""
        self.unpin_all()
        self.cache.evict(self.allocator.capacity_tokens, Tier.HIGH_REF)

    def check_integrity(self) -> None:
        self.allocator.check_integrity(self.cache.check_integrity({}))
