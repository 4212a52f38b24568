"""The `rollout` section of the config."""

from __future__ import annotations

from pydantic import Field

from venusrl.schema import Section


class RolloutConfig(Section):
    environment: str = Field("calculator", description="built-in name or 'package.module:Class'")
    max_turns: int = Field(8, ge=1, description="assistant turns per trajectory")
    max_total_tokens: int = Field(4096, ge=16, description="prompt + all turns; beyond it the trajectory is truncated")
    max_new_tokens_per_turn: int = Field(512, ge=1)
    tool_timeout_s: float = Field(30.0, gt=0, description="per tool step; a timeout becomes an observation")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    orchestration: bool = Field(
        True, description="venus's moves between engines (priority slots, more than one engine): an engine whose "
        "slots would idle takes the last turn queued on another when the move saves that queue more than it takes "
        "(both timed as the run goes), and waiting HIGH turns leave an engine past orchestration_threshold, each "
        "with its prefix KV")
    decode_balance: bool = Field(
        True, description="venus (with orchestration): an urgent turn asking for a slot moves, with its prefix KV, "
        "to the engine where the least context generates when that lowers its own engine's load, the target's HIGH "
        "KV stays under half its pool, and the move is timed to pay (once a turn)")
    isolate_step_enders: bool = Field(
        True, description="venus (with decode_balance): while the pool has room (mean HIGH KV pressure under 0.35, no "
        "admission stopped for memory since the last reading), the turns predicted to end the next training step keep "
        "their engines: no balance move lands beside them and a turn asking beside one moves to a lighter engine. "
        "An engine that does not count memory stalls (an older release over the wire) leaves it off from the first "
        "pressure reading on")
    orchestration_threshold: float = Field(
        0.9, gt=0, description="HIGH KV pressure past which an engine's waiting HIGH turns move to another engine")
    orchestration_interval_s: float = Field(0.1, gt=0, description="how often engine pressure is checked")
    demotion_refresh_interval_s: float = Field(
        0.1, gt=0, description="venus: how often each engine's demoted set (which the engine pushes whenever it "
        "changes) is read into the scheduler, so an urgent turn queued behind a holder demoted since takes its slot "
        "(the engine demotes at its own iterations; a turn asking for a slot also reads it)")
