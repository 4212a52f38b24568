"""Where a sandbox goes, and which sandbox leaves a node under OOM: pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeView:
    """The controller's latest picture of one node agent."""

    node_id: str
    alive: bool
    m_total: float
    m_used: float
    threshold: float  # the node's current T (fraction of m_total)
    groups: frozenset[str] = frozenset()

    @property
    def headroom(self) -> float:
        """Bytes below the admission line."""
        return self.threshold * self.m_total - self.m_used


def rank_nodes(nodes: Sequence[NodeView], group_id: str | None) -> list[str]:
    """Live nodes in the order to try: those already holding the group (its template pages
    are there), then by headroom, most first; ties by id so the order is deterministic."""
    live = [n for n in nodes if n.alive]
    return [n.node_id for n in sorted(live, key=lambda n: (group_id is None or group_id not in n.groups, -n.headroom, n.node_id))]


def choose_migration(sandboxes: Sequence[tuple[str, float]], targets: Sequence[NodeView]) -> tuple[str, str] | None:
    """Largest sandbox first, to the live target with the most headroom that can hold it.
    None when no target can take the largest one."""
    if not sandboxes:
        return None
    sandbox_id, size = max(sandboxes, key=lambda s: (s[1], s[0]))
    fitting = [t for t in targets if t.alive and t.headroom >= size]
    if not fitting:
        return None
    target = max(fitting, key=lambda t: (t.headroom, t.node_id))
    return sandbox_id, target.node_id
