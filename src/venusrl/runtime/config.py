"""The `scheduler` and `data` sections: how `venusrl train` wires the pieces."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from venusrl.schema import Section

SchedulerPolicy = Literal["venus", "action_level", "trajectory_level"]


class SchedulerConfig(Section):
    policy: SchedulerPolicy = Field(
        "venus",
        description="venus: critical groups HIGH (coordinator.policy ranks them), LOW only in idle slots, "
        "preemption, tiered KV; action_level: no priority, slots per turn (ROLL Flash); "
        "trajectory_level: a trajectory holds its slot through tool calls (slime)")
    engines: int = Field(1, ge=1, description="rollout engines (in-process on the local runtime)")
    slots_per_engine: int = Field(16, ge=1, description="turns generating at once per engine")


class DataConfig(Section):
    train: str | None = Field(None, description="JSONL of prompts; null: generate `generate_train` rows with the environment")
    eval: str | None = Field(None, description="JSONL of held-out prompts; null: generate `generate_eval` rows")
    generate_train: int = Field(256, ge=0, description="rows generated when `train` is null")
    generate_eval: int = Field(64, ge=0, description="rows generated when `eval` is null (0: no evaluation)")
    generate_seed: int = Field(0, description="seed of the generated training rows; held-out rows use seed + 1")
    generate_options: dict = Field(default_factory=dict, description="keyword arguments of the environment's generator")
