"""Which Ray nodes host which of a run's actors: node roles, as custom resources.

A node started with `--resources '{"venusrl_engine": N}'` is an engine node: once any node
of the cluster advertises the role, the engine actors go only to such nodes (each takes
a sliver of the resource, so one node holds many). Likewise `venusrl_sandbox` for the
sandbox node agents and `venusrl_trainer` for the rollout and trainer actors. A cluster
that advertises no role places every actor anywhere, as before roles existed. Roles let an
operator keep engines off the trainer's node (whose loss ends the run, while an engine
node's loss costs only time).
"""

from __future__ import annotations

from typing import Any, Literal

import ray

Role = Literal["engine", "sandbox", "trainer"]
SHARE = 0.001  # of a role's resource per actor: the role picks the node, never limits the count


def role_options(role: Role) -> dict[str, Any]:
    """Ray `options(...)` that keep an actor of `role` on the nodes advertising it; none when
    no node does."""
    resource = f"venusrl_{role}"
    if ray.cluster_resources().get(resource, 0) <= 0:
        return {}
    return {"resources": {resource: SHARE}}
