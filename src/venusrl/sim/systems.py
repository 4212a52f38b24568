"""The systems compared, each a preset of the training config (paper §6.1 and Table 1): a
named set of overrides of the real config sections, which the simulator reads through the
same `Config` the training run reads. What a preset does not set is the real default.

- `slime`: trajectory-level slots (`scheduler.policy: trajectory_level`: a trajectory keeps
  its slot through tool calls), no group priority, SGLang's LRU radix cache.
- `rollflash`: action-level slots (`scheduler.policy: action_level`), no group priority, LRU.
- `thunderagent`: ThunderAgent in front of SGLang (`scheduler.policy: thunderagent`): turns
  forwarded as they come (action-level slots, the same concurrency bound as the others'),
  SGLang's LRU radix cache, and its capacity scheduling (`rollout/live_set.py`, the source's
  lines cited there): every 5 s, programs pause, those in a tool call first, smallest first,
  so the live ones' KV fits each engine's pool, and resume by its order; a paused program's
  turn waits outside the engine. No trainer priority.
- `venus`: the training config's defaults: priority slots, the length-prediction rule,
  tiers + demotion, orchestration with decode balance, and the live set ranked by the
  trainer's need (PROMOTED and critical programs stay live; the others pause first). As in §4.3, a demoted trajectory
  is LOW, for its slot as well as its KV.
- Table 1's ablations: `baseline` (= rollflash), then `+priority`, `+kv_residency`,
  `+migration` (the paper's venus, without the live set), `+live_set`, then
  `+decode_balance` (= venus: urgent turns move to the engine where the least context
  generates, `rollout.decode_balance`, and, while the pool has room, the predicted step enders
  keep their engines, `rollout.isolate_step_enders`).

Moves between engines are the training config's `rollout.orchestration` (off in every
system but venus and +migration).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from venusrl.config import Config, ConfigError, config_from
from venusrl.coordinator.config import PolicyName
from venusrl.rollout.slots import SlotMode

# SGLang's radix cache as the baselines run it: LRU eviction, no residency-aware demotion.
SGLANG_CACHE = {"engine.cache_policy": "lru", "engine.demotion": False}

# What each baseline's engines do with cached KV at a weight update: all three flush it, so
# every token after the update is recomputed by the new weights (`recompute`; SGLang's
# flush_cache resets the radix tree, and with HiCache the host pool too: HiRadixCache.reset
# clears token_to_kv_pool_host).
# - slime: `UpdateWeightFromDistributed.update_weights` pauses generation, then calls
#   `flush_cache` on every rollout engine before the broadcast ("Pause -> flush -> ...";
#   THUDM/slime slime/backends/megatron_utils/update_weight/update_weight_from_distributed.py,
#   commit 02a644a).
# - ROLL Flash: the agentic pipeline's step offloads the inference states, updates the model
#   and calls `actor_infer.load_states()`, whose SGLang strategy starts with `flush_cache()`
#   (vLLM: `reset_prefix_cache()`) (alibaba/ROLL roll/pipeline/agentic/agentic_pipeline.py
#   phases 2-4 and roll/distributed/strategy/sglang_strategy.py `load_states`, commit 8eb27cc).
# - ThunderAgent schedules programs in front of the engines of an RL framework, which owns
#   the weight update: its RL examples run under slime (flush as above) and SkyRL, whose
#   workers call `inference_engine_client.reset_prefix_cache()` at each weight sync
#   (ThunderAgent-org/ThunderAgent examples/rl_training/, skyrl_train/workers/fsdp/fsdp_worker.py,
#   commit a7eef77).
# venus keeps the training default, `recompute` too. `keep` is the sensitivity table's row.
FLUSH_AT_WEIGHT_UPDATE = {"engine.kv_after_weight_update": "recompute"}

# No turn moves between engines (only venus moves them; the slot-level baselines could not anyway).
NO_MOVES = {"rollout.orchestration": False}
# The paper's venus: every runnable turn competes for KV (no programs paused), and a turn moves
# only when it waits (stealing) or its engine's HIGH KV is past the threshold.
NO_LIVE_SET = {"scheduler.live_set": False}
NO_DECODE_BALANCE = {"rollout.decode_balance": False}


@dataclass(slots=True, frozen=True)
class Preset:
    overrides: Mapping[str, Any]  # dotted keys of the training config


PRESETS: dict[str, Preset] = {
    "slime": Preset({"scheduler.policy": "trajectory_level", **SGLANG_CACHE, **FLUSH_AT_WEIGHT_UPDATE, **NO_MOVES}),
    "rollflash": Preset({"scheduler.policy": "action_level", **SGLANG_CACHE, **FLUSH_AT_WEIGHT_UPDATE, **NO_MOVES}),
    "thunderagent": Preset({"scheduler.policy": "thunderagent", **SGLANG_CACHE, **FLUSH_AT_WEIGHT_UPDATE,
                            **NO_MOVES}),
    "venus": Preset({}),
    "baseline": Preset({"scheduler.policy": "action_level", **SGLANG_CACHE, **NO_MOVES}),
    "+priority": Preset({"scheduler.policy": "venus", **SGLANG_CACHE, **NO_MOVES, **NO_LIVE_SET}),
    "+kv_residency": Preset({"scheduler.policy": "venus", **NO_MOVES, **NO_LIVE_SET}),
    "+migration": Preset({**NO_LIVE_SET, **NO_DECODE_BALANCE}),
    "+live_set": Preset(NO_DECODE_BALANCE),
    "+decode_balance": Preset({}),
}


@dataclass(slots=True, frozen=True)
class SystemSpec:
    """A system as the simulator reads it: the training config with the system's preset (and
    the cell's settings) applied; every attribute below is read from it."""

    name: str
    config: Config

    @property
    def orchestration(self) -> bool:
        return self.config.rollout.orchestration

    @property
    def slot_mode(self) -> SlotMode:
        return self.config.scheduler.slot_mode

    @property
    def policy(self) -> PolicyName:
        return self.config.coordinator.policy

    @property
    def cache_policy(self) -> Literal["tiers", "lru"]:
        return self.config.engine.cache_policy

    @property
    def demotion(self) -> bool:
        return self.config.engine.demotion

    @property
    def demotion_order(self) -> Literal["shortest", "idle_first"]:
        return self.config.engine.demotion_order

    @property
    def uses_predictions(self) -> bool:
        return self.policy not in ("fcfs", "action_level", "oracle")


def system(name: str, policy: PolicyName | None = None, overrides: Mapping[str, Any] | None = None) -> SystemSpec:
    """The system called `name`, optionally ranking groups with another rule (e.g. venus with
    an improved one), with the cell's config settings `overrides` on top of its preset."""
    if name not in PRESETS:
        raise ValueError(f"system {name!r} is unknown (known: {', '.join(PRESETS)})")
    preset = PRESETS[name]
    merged = {**preset.overrides, **({"scheduler.priority": policy} if policy is not None else {}),
              **(overrides or {})}
    try:
        config = config_from(merged)
    except ConfigError as err:
        raise ValueError(f"system {name!r}: {err}") from None
    return SystemSpec(name if policy is None else f"{name}[{policy}]", config)


SYSTEMS = {name: system(name) for name in PRESETS}
