"""The `scheduler` and `data` sections: how `venusrl train` wires the pieces."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from venusrl.coordinator.config import DEFAULT_POLICY, PolicyName
from venusrl.rollout.live_set import (
    BUFFER_PER_PROGRAM,
    THRASH_FRACTION,
    THUNDERAGENT_INTERVAL_S,
    LiveSetRuleName,
)
from venusrl.rollout.slots import SlotMode
from venusrl.schema import Section

SchedulerPolicy = Literal["venus", "thunderagent", "action_level", "trajectory_level"]
# ThunderAgent is a router in front of the engines: it forwards a live program's request as it
# comes (first come, first served per turn, as action_level), and pauses programs (live_set).
SLOT_MODES: dict[SchedulerPolicy, SlotMode] = {
    "venus": "priority", "thunderagent": "action_level", "action_level": "action_level",
    "trajectory_level": "trajectory_level"}
NO_PRIORITY: PolicyName = "action_level"  # the rule that marks no group HIGH


class SchedulerConfig(Section):
    """The one place that says how rollout is scheduled: the slot mode (`policy`) and the rule
    that ranks groups (`priority`); the coordinator's rule is derived from them (`ranking`)."""

    policy: SchedulerPolicy = Field(
        "venus",
        description="venus: critical groups HIGH (scheduler.priority ranks them), LOW only in idle slots, "
        "preemption, tiered KV; thunderagent: ThunderAgent's program-aware capacity scheduling (programs "
        "paused so the live ones' KV fits the pool, no group priority); action_level: no priority, slots per "
        "turn (ROLL Flash); trajectory_level: a trajectory holds its slot through tool calls (slime)")
    priority: PolicyName = Field(
        DEFAULT_POLICY,
        description="venus: the rule that marks the groups the next step needs HIGH (length_prediction: the "
        "paper's; critical_path: longest critical group first; fcfs; action_level: none; oracle: simulator "
        "only). The baselines rank no group, so with them it must be left unset")
    engines: int = Field(1, ge=1, description="rollout engines (in-process on the local runtime)")
    slots_per_engine: int = Field(16, ge=1, description="turns generating at once per engine")
    live_set: bool = Field(
        True, description="venus: pause programs, least urgent first, so the live ones' KV fits each engine's "
        "pool (rollout/live_set.py), as ThunderAgent does but ranked by the trainer's need; false: every "
        "runnable turn competes for KV. thunderagent always pauses (its own rule); the others never do")
    live_set_interval_s: float = Field(
        THUNDERAGENT_INTERVAL_S, gt=0, description="seconds between live-set checks (ThunderAgent's "
        "scheduler_interval, 5 s)")
    live_set_buffer_tokens: int = Field(
        BUFFER_PER_PROGRAM, ge=0, description="tokens of decode headroom each live program reserves in its "
        "engine's pool (ThunderAgent's BUFFER_PER_PROGRAM, 100 tokens against turns of a few hundred)")
    live_set_thrash_fraction: float = Field(
        THRASH_FRACTION, ge=0, le=1, description="venus: an engine's live set engages (pauses programs there) "
        "once the engine recomputes more than this share of the context its requests bring, over windows of a "
        "pool's worth; until then nothing is paused there (0: engaged from the start; thunderagent ignores it)")
    acting_token_decay: bool = Field(
        False, description="a resume counts a program's tokens in a tool call with a 2^-t decay, t its seconds "
        "there (ThunderAgent's --use-acting-token-decay; off by default there too)")

    @property
    def slot_mode(self) -> SlotMode:
        return SLOT_MODES[self.policy]

    @property
    def live_set_rule(self) -> LiveSetRuleName | None:
        """The rule that pauses programs: ThunderAgent's, venus's, or none."""
        if self.policy == "thunderagent":
            return "thunderagent"
        return "venus" if self.policy == "venus" and self.live_set else None

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
