"""What the Ray runtime's actors and the process driving them share: calling an actor's
methods as coroutines, an actor's log lines into the run's train.log, and where an actor runs."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayTaskError


class ActorProxy:
    """`await proxy.method(*args)` is `await actor.method.remote(*args)`."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.actor, name)

        async def call(*args: Any) -> Any:
            try:
                return await method.remote(*args)
            except RayTaskError as err:
                raise err.cause from err  # what the service raised; the actor's traceback stays chained

        return call


def log_to_run(run_dir: Path, level: str, role: str) -> None:
    """This actor's log lines go to the run's train.log, next to the driver's."""
    handler = logging.FileHandler(run_dir / "train.log")
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s [{role}] %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)


def placement() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": ray.util.get_node_ip_address()}
