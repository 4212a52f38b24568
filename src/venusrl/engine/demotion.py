"""Residency-aware demotion (paper §4.3): which HIGH trajectories to run as LOW for now.

`rebalance` runs at every iteration boundary, after queued trajectory changes are applied
and before the batch is formed, so admission and eviction see the demoted set of this
boundary. It measures the HIGH/PROMOTED KV demand with shared pages counted once
(`distinct_high_demand`), picks the trajectories to demote (`choose_demoted`) and flips only
those whose state changed. The same demand over capacity is the engine's `high_pressure`,
which the request orchestrator reads.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping

from venusrl.engine.config import EngineConfig
from venusrl.engine.radix_cache import RadixCache, RadixNode
from venusrl.engine.request import Request
from venusrl.engine.stats import Counters
from venusrl.types import Priority


def choose_demoted(
    contexts: Mapping[Hashable, int],
    demotable: Mapping[Hashable, bool],
    capacity_tokens: int,
    exclusive: Mapping[Hashable, int] | None = None,
    demand: int | None = None,
    active: Collection[Hashable] | None = None,
) -> set[Hashable]:
    """Demote HIGH trajectories, shortest context first, until the rest fit in capacity.

    ``contexts`` holds the context tokens of every HIGH or PROMOTED trajectory; ``demotable``
    says which of them are HIGH (PROMOTED ones are never demoted). Trajectories of a group
    share prompt pages, so the KV demand is the distinct tokens (``demand``), and demoting a
    trajectory frees only what no other HIGH trajectory shares (``exclusive``); both default
    to treating every context as private. Shortest first keeps the long trajectories' progress
    resident. Recomputing the set every iteration promotes trajectories back as soon as
    finished HIGH ones free the room. With ``active`` (the trajectories that have a request in
    the engine), the idle ones (waiting on a tool) go first, each set shortest first
    (ThunderAgent's order: an idle program's KV is not read until its tool returns).
    """
    exclusive = contexts if exclusive is None else exclusive
    demand = sum(contexts.values()) if demand is None else demand
    demoted: set[Hashable] = set()
    if demand <= capacity_tokens:
        return demoted
    def order(key: Hashable) -> tuple[bool, int]:
        return active is not None and key in active, contexts[key]

    # sorted() is stable: equal keys keep the caller's (start) order.
    for key in sorted((k for k in contexts if demotable[k]), key=order):
        if demand <= capacity_tokens:
            break
        demoted.add(key)
        demand -= exclusive[key]
    return demoted


def rebalance(config: EngineConfig, cache: RadixCache, requests: Collection[Request], counters: Counters) -> None:
    """Recompute the demoted set from this boundary's demand; count each change."""
    trajectories = cache.trajectories
    contexts, uncached = high_contexts(cache, requests)
    capacity = cache.allocator.capacity_tokens
    demoted: set[Hashable] = set()
    # The sum of contexts bounds the distinct demand from above: only past it can anything
    # need demoting, and only then is the walk over the cached paths worth its cost.
    if config.demotion and config.cache_policy == "tiers" and sum(contexts.values()) > capacity:
        demand, exclusive = distinct_high_demand(cache, uncached)
        demotable = {k: trajectories[k].priority == Priority.HIGH for k in contexts}
        active = None
        if config.demotion_order == "idle_first":
            active = {request.trajectory_key for request in requests}
        demoted = choose_demoted(contexts, demotable, capacity, exclusive, demand, active)
    for key, trajectory in trajectories.items():
        if trajectory.demoted != (key in demoted):
            cache.set_demoted(key, key in demoted)
            if key in demoted:
                counters.demotions += 1
            else:
                counters.promotions += 1


def high_pressure(cache: RadixCache, requests: Iterable[Request]) -> float:
    """HIGH/PROMOTED KV demand (shared pages once) over the pool's capacity."""
    demand, _ = distinct_high_demand(cache, high_contexts(cache, requests)[1])
    return demand / cache.allocator.capacity_tokens


def high_contexts(cache: RadixCache, requests: Iterable[Request]) -> tuple[dict[Hashable, int], dict[Hashable, int]]:
    """Context tokens of every HIGH/PROMOTED trajectory (cached path or running sequence,
    the longer) and the part of its running sequence not yet in the tree."""
    contexts = {k: t.context_tokens for k, t in cache.trajectories.items() if t.priority != Priority.LOW}
    uncached = dict.fromkeys(contexts, 0)
    for request in requests:
        key = request.trajectory_key
        if key in contexts:
            uncached[key] = max(uncached[key], request.seq_len - contexts[key])
            contexts[key] = max(contexts[key], request.seq_len)
    return contexts, uncached


def distinct_high_demand(cache: RadixCache, uncached: Mapping[Hashable, int]) -> tuple[int, dict[Hashable, int]]:
    """KV the HIGH trajectories need with shared pages counted once (a group's prompt is
    one demand, not K), and what demoting each would free: the pages no other HIGH
    trajectory shares, plus its uncached tail."""
    trajectories, root = cache.trajectories, cache.root
    sharing: dict[RadixNode, int] = {}
    paths: dict[Hashable, list[RadixNode]] = {}
    for key in uncached:
        path, node = [], trajectories[key].anchor
        while node is not None and node is not root:
            path.append(node)
            sharing[node] = sharing.get(node, 0) + 1
            node = node.parent
        paths[key] = path
    demand = sum(len(node.key) for node in sharing) + sum(uncached.values())
    exclusive = {
        k: uncached[k] + sum(len(n.key) for n in path if sharing[n] == 1) for k, path in paths.items()
    }
    return demand, exclusive
