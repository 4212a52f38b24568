"""A small simulated cluster that runs in well under a second."""

from __future__ import annotations

from venusrl.sim.cost_model import CostModel
from venusrl.sim.run import SimSpec
from venusrl.sim.systems import system
from venusrl.sim.trainer import TrainerCost
from venusrl.sim.workload import WorkloadConfig

SMALL_WORKLOAD = WorkloadConfig(
    group_size=4, turns_median_easy=2, turns_median_hard=6, max_turns=10, gen_tokens_median_easy=100,
    gen_tokens_median_hard=300, obs_tokens_median=80, prompt_tokens_median=200, max_total_tokens=3000,
    tool_seconds_median=1.0,
)  # fmt: skip
# A pool of 4,000 tokens: far less than the trajectories in flight need, so eviction runs.
SMALL_COST = CostModel(fixed_s=0.01, token_s=2e-5, kv_token_s=1e-7, reload_token_s=2e-6, kv_capacity_tokens=4000)


# The small cluster's training-config settings: B = 2, three slots per engine.
SMALL_CLUSTER = {"coordinator.batch_groups": 2, "coordinator.async_factor": 1.5, "scheduler.slots_per_engine": 3}


def small_spec(name: str, policy: str | None = None, config: dict | None = None, **fields) -> SimSpec:
    """`config`: training-config settings (dotted keys) over SMALL_CLUSTER; `fields`: SimSpec's."""
    options = dict(workload=SMALL_WORKLOAD, generation_gpus=2, steps=3, quantum=16, cost=SMALL_COST,
                   trainer=TrainerCost(token_s=1e-4, step_s=1.0), weight_sync_s=0.1)
    options.update(fields)
    return SimSpec(system(name, policy, {**SMALL_CLUSTER, **(config or {})}), **options)
