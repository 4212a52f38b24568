"""Which Ray nodes host which of a run's actors: node roles, as custom resources.

A node started with `--resources '{"venusrl_engine": N}'` is an engine node with room for N
engines: once any node of the cluster advertises the role, each engine actor takes one unit
of it, so engines go only to such nodes, N at most on each, and a lost engine's replacement
waits for room (the lost node back, or a new one). `venusrl_sandbox` (the sandbox node
agents) and `venusrl_trainer` (the rollout and trainer actors) only pick nodes: each actor
takes a sliver, so one node holds any number. A cluster
that advertises no role places every actor anywhere, as before roles existed. Roles let an
operator keep engines off the trainer's node (whose loss ends the run, while an engine
node's loss costs only time).
"""

from __future__ import annotations

from typing import Any, Literal

import ray

from venusrl.config import ConfigError

Role = Literal["engine", "sandbox", "trainer"]
SHARE = 0.001  # of a sandbox or trainer node's role resource per actor: it picks the node, never limits the count


def role_options(role: Role) -> dict[str, Any]:
    """Ray `options(...)` that keep an actor of `role` on the nodes advertising it; none when
    no node does."""
    resource = f"venusrl_{role}"
    if ray.cluster_resources().get(resource, 0) <= 0:
        return {}
    return {"resources": {resource: 1.0 if role == "engine" else SHARE}}


def check_engine_room(engines: int) -> None:
    """A cluster advertising engine nodes has room for `engines` engines on them, or this
    raises (rather than the run waiting forever for its engine actors to be placed)."""
    room = ray.cluster_resources().get("venusrl_engine", 0)
    if 0 < room < engines:
        raise ConfigError(f"scheduler.engines={engines}: the Ray cluster's engine nodes have room for {room:g} "
                          "(the sum of their venusrl_engine resources)")
