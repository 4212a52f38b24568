"""Residency-aware demotion (paper §4.3): which HIGH trajectories to run as LOW for now."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping


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
