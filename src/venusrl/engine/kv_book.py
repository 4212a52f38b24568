"""KV bookkeeping of the scheduler (pure: slots are integers, the runner owns the tensors).

One object owns the device pages (`PageAllocator`), the radix tree over them (`RadixCache`),
the optional host tier (`HostTier`), the device <-> host copies owed to the runner, and an
open prefix-import reservation. It knows requests only through their slot fields
(`kv_slots`, `cached_len`, `num_computed`, `prefix_node`); the queues are not its business.

Invariants (checked by `scheduler_stats.check_integrity`): every device page is free, in the
tree, or private to exactly one running request; a running request's first `cached_len`
slots are the tree's path to its locked `prefix_node`; its private slots start at a page
boundary. Memory is only ever taken through `take_pages`, which evicts no tier above the one
it is given, and every caller first checks `available_pages` for that tier, so a request is
never granted KV beyond the tier it is given (admission and eviction read the same counters):
its priority's (`max_evictable_tier`), or every unlocked tier when the scheduler finds it the
only work of the iteration (`admission.Step.eviction_tier`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from venusrl.engine.batch import KVCopy
from venusrl.engine.config import EngineConfig
from venusrl.engine.host_tier import HostTier
from venusrl.engine.kv_slots import PageAllocator
from venusrl.engine.radix_cache import RadixCache, RadixNode, Tier
from venusrl.engine.request import Request


class KVBook:
    def __init__(self, config: EngineConfig) -> None:
        self.allocator = PageAllocator(config.kv_capacity_tokens, config.page_size)
        self.cache = RadixCache(self.allocator, config.cache_policy)
        self.host: HostTier | None = None
        if config.host_kv_capacity_tokens >= config.page_size:
            self.host = HostTier(config.host_kv_capacity_tokens, config.page_size)
        self._copies: list[KVCopy] = []  # device <-> host copies owed before the next forward
        self._computed_by_trajectory: dict[Hashable, int] = {}  # longest sequence computed
        self._reservation: RadixNode | None = None  # locked prefix of an open reserve_prefix

    # ---- budgets -------------------------------------------------------------------------

    def available_pages(self, max_tier: Tier) -> int:
        """Pages a request allowed to evict up to ``max_tier`` can get: the admission budget."""
        return (
            self.allocator.free_pages
            + self.cache.evictable_tokens(max_tier) // self.allocator.page_size
        )

    def room_and_pages(self, request: Request, count: int) -> tuple[int, int]:
        """Free slots left in the request's last private page, and new pages ``count`` more
        tokens need beyond them."""
        room = -(len(request.kv_slots) - request.cached_len) % self.allocator.page_size
        return room, self.allocator.pages_for(max(0, count - room))

    def outgrew_pool(self, request: Request, count: int) -> bool:
        """Even evicting every unlocked page would not make room: the sequence ends ("length").
        A request short only of pages others lock (or, beside other running work, of pages
        its priority may not evict) is retracted instead, to resume when they are released."""
        return self.available_pages(Tier.HIGH_REF) < self.room_and_pages(request, count)[1]

    # ---- growth --------------------------------------------------------------------------

    def grow(self, request: Request, count: int, max_tier: Tier) -> bool:
        """Allocate slots for ``count`` more tokens, evicting no tier above ``max_tier``."""
        room, need = self.room_and_pages(request, count)
        if self.available_pages(max_tier) < need:
            return False
        slots = request.kv_slots
        target = len(slots) + count
        if room:
            slots.extend(range(slots[-1] + 1, slots[-1] + 1 + min(room, count)))
        slots.extend(self.allocator.slots_of(self.take_pages(need, max_tier)))
        del slots[target:]
        return True

    def take_pages(self, need: int, max_tier: Tier) -> list[int]:
        """Allocate ``need`` pages, evicting up to ``max_tier`` first. Callers check
        ``available_pages``; eviction reads the same counters, so the check is honoured."""
        free = self.allocator.free_pages
        if free < need:
            save = self._save_to_host if self.host is not None else None
            self.cache.evict((need - free) * self.allocator.page_size, max_tier, save)
            if self.allocator.free_pages < need:
                raise AssertionError("eviction freed less than the admission budget counted")
        return self.allocator.alloc(need)

    def _save_to_host(self, node: RadixNode) -> None:
        copy = self.host.save(*self.cache.path_of(node))
        if copy is not None:
            self._copies.append(copy)

    def attach(self, request: Request, max_chunk: int, max_tier: Tier) -> tuple[int, int] | None:
        """Give a waiting request its cached prefix (locked), the host-cached continuation
        (loaded back, not computed) and slots for a first chunk of at most ``max_chunk``
        tokens. Returns (chunk, loaded), or None, with nothing changed but LRU clocks and
        host pins, when evicting up to ``max_tier`` does not free enough."""
        tokens = request.all_ids
        # Keep at least the last token to compute: its logits give the next sample.
        match = self.cache.match_prefix(tokens[:-1])
        self.cache.lock(match.node)
        cached = len(match.slots)
        host_slots = self.host.continuation(tokens[:-1], cached) if self.host is not None else []
        loaded = len(host_slots)
        count = min(len(tokens) - cached - loaded, max_chunk)
        request.kv_slots, request.cached_len = list(match.slots), cached
        request.num_computed, request.prefix_node = cached, match.node
        if not self.grow(request, loaded + count, max_tier):
            self.cache.unlock(match.node)
            request.kv_slots, request.cached_len, request.num_computed = [], 0, 0
            request.prefix_node = None
            return None
        if loaded:
            self._copies.append(KVCopy(False, request.kv_slots[cached : cached + loaded], host_slots))
            request.num_computed += loaded
        return count, loaded

    def computed_before(self, request: Request) -> int:
        """Most tokens of this request's sequence computed before, by it or its trajectory
        (what a prefill beyond the cache hit computes again)."""
        return max(request.prior_computed, self._computed_by_trajectory.get(request.trajectory_key, 0))

    # ---- caching and release -------------------------------------------------------------

    def cache_computed_prefix(self, request: Request) -> None:
        """Put the computed whole pages into the tree (so requests sharing the prefix hit it)
        and lock them for this request in place of its private copies."""
        page = self.allocator.page_size
        aligned = request.num_computed - request.num_computed % page
        if aligned <= request.cached_len:
            return
        tokens = request.token_range(0, aligned)
        existing, _ = self.cache.insert(tokens, request.kv_slots[:aligned])
        self.allocator.free(
            self.allocator.pages_of(request.kv_slots[request.cached_len : existing])
        )
        match = self.cache.match_prefix(tokens)
        self.cache.lock(match.node)
        self.cache.unlock(request.prefix_node)
        request.kv_slots[:aligned] = match.slots
        request.cached_len, request.prefix_node = aligned, match.node

    def release(self, request: Request) -> None:
        """Cache the computed whole pages under the request's trajectory, unlock, free the rest."""
        page = self.allocator.page_size
        aligned = request.num_computed - request.num_computed % page
        existing, node = self.cache.insert(
            request.token_range(0, aligned), request.kv_slots[:aligned]
        )
        slots = request.kv_slots
        self.allocator.free(self.allocator.pages_of(slots[request.cached_len : existing]))
        self.allocator.free(self.allocator.pages_of(slots[aligned:]))
        if request.trajectory_key in self.cache.trajectories and node is not self.cache.root:
            self.cache.set_anchor(request.trajectory_key, node)
        self.cache.unlock(request.prefix_node)
        key = request.trajectory_key
        self._computed_by_trajectory[key] = max(
            self._computed_by_trajectory.get(key, 0), request.num_computed
        )
        request.prior_computed = max(request.prior_computed, request.num_computed)
        request.kv_slots, request.cached_len, request.num_computed = [], 0, 0
        request.prefix_node = None

    def forget_trajectory(self, key: Hashable) -> None:
        """A released trajectory's computed length no longer counts as recomputation."""
        self._computed_by_trajectory.pop(key, None)

    def drop_all(self) -> int:
        """Evict the whole tree and host tier (running requests released first by the
        caller); owed saves of stale KV are void, and nothing counts as computed before any
        more (prefilling with new weights recomputes nothing that was evicted: it is counted as
        dropped, not as recompute, as the vLLM scheduler class's `HoldBook.clear` does).
        Returns the device tokens dropped."""
        self._computed_by_trajectory.clear()
        if self.host is not None:
            self.host.drop_all()
        self._copies.clear()
        return self.cache.evict(self.allocator.capacity_tokens, Tier.HIGH_REF)

    def take_copies(self) -> list[KVCopy]:
        """The device <-> host copies owed so far, in order; host pins end with them."""
        copies, self._copies = self._copies, []
        if self.host is not None:
            self.host.unpin_all()
        return copies

    # ---- prefix import (migration between engines) ---------------------------------------

    @property
    def reservation_open(self) -> bool:
        return self._reservation is not None

    def cached_prefix_slots(self, token_ids: Sequence[int]) -> list[int]:
        """Slots of the longest cached page-aligned prefix of ``token_ids``, for export."""
        return self.cache.match_prefix(token_ids).slots

    def reserve_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], int]:
        """Reserve whole pages for the uncached part of ``token_ids``, evicting only unused
        and low_ref KV, as many as that allows. Returns the new slots and ``offset``, the
        tokens already cached (the new slots are for ``token_ids[offset:]``)."""
        if self._reservation is not None:
            raise RuntimeError("reserve_prefix needs no open reservation")
        page = self.allocator.page_size
        match = self.cache.match_prefix(token_ids)
        self.cache.lock(match.node)  # the matched prefix must survive our own eviction
        offset = len(match.slots)
        wanted = (len(token_ids) - offset) // page
        pages = self.take_pages(min(wanted, self.available_pages(Tier.LOW_REF)), Tier.LOW_REF)
        self._reservation = match.node
        return self.allocator.slots_of(pages), offset

    def commit_prefix(self, token_ids: Sequence[int], new_slots: list[int], offset: int) -> list[int]:
        """Insert the reserved, now loaded, slots into the tree and end the reservation;
        returns the tokens now cached (``token_ids[: offset + len(new_slots)]``)."""
        node, self._reservation = self._reservation, None
        if node is None:
            raise RuntimeError("commit_prefix without reserve_prefix")
        tokens = list(token_ids[: offset + len(new_slots)])
        slots = self.cache.match_prefix(tokens[:offset]).slots + new_slots
        existing, _ = self.cache.insert(tokens, slots)
        # Nothing ran since the reservation, so nothing else inserted: all new slots are kept.
        if existing != offset:
            raise AssertionError(
                f"prefix changed between reserve and commit ({existing} != {offset})"
            )
        self.cache.unlock(node)
        return tokens
