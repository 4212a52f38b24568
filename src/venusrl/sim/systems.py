"""The systems compared, each a configuration of the same code (paper §6.1 and Table 1).

- `slime`: trajectory-level slots (a trajectory keeps its slot through tool calls), FCFS,
  SGLang's LRU radix cache with the host tier (HiCache).
- `rollflash`: action-level slots, FCFS, LRU + host tier.
- `thunderagent`: program-aware scheduling (ThunderAgent) with no trainer priority: every
  program is HIGH in the engine, and when the programs' KV outgrows the pool the engine's
  demotion pauses the programs with no request in the engine (waiting on a tool or for a
  slot) first, smallest first, then generating ones, smallest first
  (`demotion_order="idle_first"`; a paused generating request is retracted before others).
  Concurrency is the same bound as the others' (`slots_per_engine` per engine,
  `max_running_requests`): the slots are granted non-paused programs before paused ones, and
  a non-paused program that finds them full takes the slot of the latest paused holder, so a
  paused program never blocks the programs whose KV keeps it paused.
- `venus`: priority slots, the length-prediction policy, tiers + demotion, orchestration. As
  in §4.3, a demoted trajectory is LOW, for its slot as well as its KV.
- Table 1's ablations: `action_level` (the baseline: rollflash with venus's engine), then
  `+priority`, `+kv_residency`, `+migration` (= venus).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from venusrl.coordinator.config import PolicyName
from venusrl.rollout.slots import SlotMode


@dataclass(slots=True, frozen=True)
class SystemSpec:
    name: str
    slot_mode: SlotMode
    policy: PolicyName
    cache_policy: Literal["tiers", "lru"]
    demotion: bool
    orchestration: bool
    host_tier: bool = True
    program_aware: bool = False  # thunderagent: all HIGH in the engine, slots by paused/not
    demotion_order: Literal["shortest", "idle_first"] = "shortest"  # see EngineConfig.demotion_order

    @property
    def uses_predictions(self) -> bool:
        return self.policy not in ("fcfs", "action_level", "oracle")


SLIME = SystemSpec("slime", "trajectory_level", "fcfs", "lru", demotion=False, orchestration=False)
ROLLFLASH = SystemSpec("rollflash", "action_level", "fcfs", "lru", demotion=False, orchestration=False)
THUNDERAGENT = SystemSpec("thunderagent", "priority", "action_level", "tiers", demotion=True, orchestration=False,
                          program_aware=True, demotion_order="idle_first")
VENUS = SystemSpec("venus", "priority", "length_prediction", "tiers", demotion=True, orchestration=True)

BASELINE = replace(ROLLFLASH, name="baseline")
PLUS_PRIORITY = replace(BASELINE, name="+priority", slot_mode="priority", policy="length_prediction")
PLUS_KV = replace(PLUS_PRIORITY, name="+kv_residency", cache_policy="tiers", demotion=True)
PLUS_MIGRATION = replace(PLUS_KV, name="+migration", orchestration=True)

SYSTEMS = {s.name: s for s in (SLIME, ROLLFLASH, THUNDERAGENT, VENUS, BASELINE, PLUS_PRIORITY, PLUS_KV, PLUS_MIGRATION)}


def system(name: str, policy: PolicyName | None = None) -> SystemSpec:
    """The system called `name`, optionally with another priority policy (e.g. venus with
    an improved rule)."""
    if name not in SYSTEMS:
        raise ValueError(f"system {name!r} is unknown (known: {', '.join(SYSTEMS)})")
    spec = SYSTEMS[name]
    return spec if policy is None else replace(spec, name=f"{name}[{policy}]", policy=policy)
