"""The `scheduler` and `data` sections: how `venusrl train` wires the pieces."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from venusrl.coordinator.config import DEFAULT_POLICY, PolicyName
from venusrl.rollout.slots import SlotMode
from venusrl.schema import Section

SchedulerPolicy = Literal["venus", "action_level", "trajectory_level"]
SLOT_MODES: dict[SchedulerPolicy, SlotMode] = {
    "venus": "priority", "action_level": "action_level", "trajectory_level": "trajectory_level"}
NO_PRIORITY: PolicyName = "action_level"  # the rule that marks no group HIGH


class SchedulerConfig(Section):
    """The one place that says how rollout is scheduled: the slot mode (`policy`) and the rule
    that ranks groups (`priority`); the coordinator's rule is derived from them (`ranking`)."""

    policy: SchedulerPolicy = Field(
        "venus",
        description="venus: critical groups HIGH (scheduler.priority ranks them), LOW only in idle slots, "
        "preemption, tiered KV; action_level: no priority, slots per turn (ROLL Flash); "
        "trajectory_level: a trajectory holds its slot through tool calls (slime)")
    priority: PolicyName = Field(
        DEFAULT_POLICY,
        description="venus: the rule that marks the groups the next step needs HIGH (length_prediction: the "
        "paper's; critical_path: longest critical group first; fcfs; action_level: none; oracle: simulator "
        "only). The baselines rank no group, so with them it must be left unset")
    engines: int = Field(1, ge=1, description="rollout engines (in-process on the local runtime)")
    slots_per_engine: int = Field(16, ge=1, description="turns generating at once per engine")

    @property
    def slot_mode(self) -> SlotMode:
        return SLOT_MODES[self.policy]

    @property
    def ranking(self) -> PolicyName:
        """The coordinator's rule: `priority` under venus; none for the baselines."""
        return self.priority if self.policy == "venus" else NO_PRIORITY


class DataConfig(Section):
    train: str | None = Field(None, description="JSONL of prompts; null: generate `generate_train` rows with the environment")
    eval: str | None = Field(None, description="JSONL of held-out prompts; null: generate `generate_eval` rows")
    generate_train: int = Field(256, ge=0, description="rows generated when `train` is null")
    generate_eval: int = Field(64, ge=0, description="rows generated when `eval` is null (0: no evaluation)")
    generate_seed: int = Field(0, description="seed of the generated training rows; held-out rows use seed + 1")
    generate_options: dict = Field(default_factory=dict, description="keyword arguments of the environment's generator")
