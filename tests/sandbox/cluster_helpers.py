"""Building local clusters for sandbox tests."""

from __future__ import annotations

from venusrl.sandbox.cluster import LocalCluster
from venusrl.sandbox.config import SandboxConfig

MiB = 1 << 20


def make_cluster(budgets: list[int], **overrides) -> LocalCluster:
    config = SandboxConfig(nodes=len(budgets), cold_start_default=16 * MiB, oom_grace_s=20.0, **overrides)
    return LocalCluster(config, budgets=budgets)
