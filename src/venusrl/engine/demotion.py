"""Residency-aware demotion (paper §4.3): which HIGH trajectories to run as LOW for now."""

from __future__ import annotations

from collections.abc import Hashable, Mapping


def choose_demoted(
    contexts: Mapping[Hashable, int], demotable: Mapping[Hashable, bool], capacity_tokens: int
) -> set[Hashable]:
    """Demote HIGH trajectories, shortest context first, until the rest fit in capacity.

    ``contexts`` holds the KV demand (context tokens) of every HIGH or PROMOTED trajectory;
    ``demotable`` says which of them are HIGH (PROMOTED ones are never demoted). Shortest
    first keeps the long trajectories' progress resident. Recomputing the set every
    iteration promotes trajectories back as soon as finished HIGH ones free the room.
    """
    demand = sum(contexts.values())
    demoted: set[Hashable] = set()
    if demand <= capacity_tokens:
        return demoted
    # sorted() is stable: equal contexts keep the caller's (start) order.
    for key in sorted((k for k in contexts if demotable[k]), key=contexts.__getitem__):
        if demand <= capacity_tokens:
            break
        demoted.add(key)
        demand -= contexts[key]
    return demoted
