"""What the scheduler reports and what it checks about itself (pure).

`count_admission` is the one place cache hits and recomputation are counted; `engine_stats`
reads the counters and the KV book into an `EngineStats`; `check_integrity` states the
scheduler's invariants and raises AssertionError naming the first one broken (tests call it
after every step, the engine when idle, mini-sglang-style).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable

from venusrl.engine.kv_book import KVBook
from venusrl.engine.radix_cache import Tier
from venusrl.engine.request import RequestStatus
from venusrl.engine.request_queue import RequestQueue
from venusrl.engine.stats import Counters, EngineStats
from venusrl.types import Priority


def count_admission(
    counters: Counters, prompt_tokens: int, hits: int, loaded: int, computed_before: int, declared: Priority
) -> None:
    """An admitted sequence of ``prompt_tokens``, ``hits`` of them cached (``loaded`` of
    those from the host tier); beyond the hits, what was ``computed_before`` is recomputed.
    Counted under the trajectory's ``declared`` priority (the critical path's hit rate)."""
    counters.prompt_tokens += prompt_tokens
    counters.cached_tokens += hits
    counters.host_loaded_tokens += loaded
    counters.prompt_tokens_by_priority[declared] += prompt_tokens
    counters.cached_tokens_by_priority[declared] += hits
    counters.recomputed_tokens += max(0, min(computed_before, prompt_tokens) - hits)


def engine_stats(counters: Counters, kv: KVBook, queue: RequestQueue, high_pressure: float) -> EngineStats:
    c, page = counters, kv.allocator.page_size
    tiers = kv.cache.tier_tokens()
    free = kv.allocator.free_pages * page
    capacity = kv.allocator.capacity_tokens
    trajectories = kv.cache.trajectories
    return EngineStats(
        prompt_tokens=c.prompt_tokens, cached_tokens=c.cached_tokens,
        hit_rate=c.cached_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
        hit_rate_by_priority={
            p.name.lower(): cached / prompt if prompt else 0.0
            for p, cached, prompt in zip(Priority, c.cached_tokens_by_priority, c.prompt_tokens_by_priority, strict=True)
        },
        recomputed_tokens=c.recomputed_tokens, retractions=c.retractions,
        preemptions=c.preemptions, demotions=c.demotions, promotions=c.promotions,
        evicted_tokens={tier.name.lower(): kv.cache.evicted_tokens[tier] for tier in Tier},
        kv_tokens={"free": free, "in_use": capacity - free - sum(tiers),
                   **{tier.name.lower(): tiers[tier] for tier in Tier}},
        kv_capacity_tokens=capacity, dropped_at_weight_update_tokens=c.dropped_at_weight_update_tokens,
        host_loaded_tokens=c.host_loaded_tokens,
        host_saved_tokens=kv.host.saved_tokens if kv.host else 0,
        host_kv_tokens=kv.host.used_tokens if kv.host else 0,
        high_pressure=high_pressure,
        demoted_trajectories=sum(t.demoted for t in trajectories.values()),
        live_trajectories=sum(isinstance(key, str) for key in trajectories),
        running=len(queue.running), waiting=len(queue.waiting),
        memory_stalls={p.name.lower(): n for p, n in zip(Priority, c.memory_stalls_by_priority, strict=True)},
    )  # fmt: skip


def check_integrity(kv: KVBook, queue: RequestQueue, idle_clocks: Collection[Hashable] = ()) -> None:
    """Every page is free, in the tree or private to exactly one running request; locks
    match the running requests; each running request's prefix slots are the tree's; waiting
    requests hold no KV; the request table and the queues agree; idle clocks run only for
    live trajectories; the host tier is consistent."""
    locks: Counter = Counter()
    private: list[int] = []
    root = kv.cache.root
    for request in queue.running:
        node = request.prefix_node
        if node is None or request.status is not RequestStatus.RUNNING:
            raise AssertionError(f"running request {request.request_id} holds no prefix")
        if node is not root:
            locks[node] += 1
        path: list[int] = []
        while node is not root:
            path[:0] = node.value
            node = node.parent
        if path != request.kv_slots[: request.cached_len]:
            raise AssertionError(f"request {request.request_id} prefix slots differ from the tree")
        if not request.cached_len <= request.num_computed <= len(request.kv_slots):
            raise AssertionError(f"request {request.request_id} slot counts inconsistent")
        private.extend(kv.allocator.pages_of(request.kv_slots[request.cached_len :]))
    for request in queue.waiting:
        if request.kv_slots or request.prefix_node is not None:
            raise AssertionError(f"waiting request {request.request_id} holds KV")
    if len(queue.running) + len(queue.waiting) != len(queue.requests):
        raise AssertionError("request table disagrees with the queues")
    if not set(idle_clocks) <= kv.cache.trajectories.keys():
        raise AssertionError("an idle clock runs for a trajectory that is not live")
    tree_pages = kv.cache.check_integrity(locks)
    kv.allocator.check_integrity(tree_pages + private)
    if kv.host is not None:
        kv.host.check_integrity()
