"""Building local clusters for sandbox tests."""

from __future__ import annotations

import time

from venusrl.sandbox.cluster import LocalCluster
from venusrl.sandbox.config import SandboxConfig

MiB = 1 << 20

# The clusters this test process created: the leak check looks at these alone, since other
# test runs on the same host create and remove their own `venusrl-*` roots meanwhile.
CREATED: list[LocalCluster] = []


def make_cluster(budgets: list[int], **overrides) -> LocalCluster:
    config = SandboxConfig(nodes=len(budgets), cold_start_default=16 * MiB, oom_grace_s=20.0, **overrides)
    cluster = LocalCluster(config, budgets=budgets)
    CREATED.append(cluster)
    return cluster


def until(condition, what: str, timeout_s: float = 15.0) -> None:
    """Wait for what a service brings about on its own (a kill after a timeout, a reaper
    pass); fails naming it if it does not come."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
