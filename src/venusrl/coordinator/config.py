"""The `coordinator` and `predictor` sections of the config (defaults from the paper)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from venusrl.schema import Section

PolicyName = Literal["fcfs", "action_level", "length_prediction", "critical_path", "oracle"]
PredictorName = Literal["group_history", "learned", "lm"]
DEFAULT_POLICY: PolicyName = "length_prediction"  # the paper's rule (§4.2)


class CoordinatorConfig(Section):
    group_size: int = Field(8, ge=1, description="K: trajectories per prompt (1 for PPO)")
    batch_groups: int = Field(32, ge=1, description="B: groups per optimizer step")
    async_factor: float = Field(1.5, ge=1.0, description="at most ceil(async_factor x B) groups in flight")
    max_version_span: int = Field(2, ge=0, description="weight versions a trajectory may span before it is discarded")
    policy: PolicyName = Field(
        DEFAULT_POLICY, exclude=True,
        description="the rule that ranks groups; in a training config it is not set here but derived from the "
        "scheduler section (`SchedulerConfig.ranking`), so it is left out of a dumped config (oracle: simulator only)")
    promote_at_boundary: bool = Field(True, description="PROMOTED priority at the last admissible weight version")
    max_reruns: int = Field(3, ge=0, description="re-runs of one trajectory slot before its prompt is dropped")
    prior_remaining_tokens: float = Field(2048.0, gt=0, description="remaining-token guess before any trajectory finished")
    prior_seconds_per_token: float = Field(0.02, gt=0, description="decode time per token before any turn was measured")
    prior_tool_seconds: float = Field(2.0, ge=0, description="tool-call time before any call was measured")
    prior_tokens_per_turn: float = Field(256.0, gt=0, description="generated tokens per turn before any turn was measured")
    stats_smoothing: float = Field(0.05, gt=0, le=1, description="weight of a new sample in the running estimates")


class PredictorConfig(Section):
    kind: PredictorName = Field("learned", description="length predictor")
    path: str | None = Field(None, description="trained predictor to load (learned: .safetensors file, lm: directory)")
    prior_remaining_tokens: float = Field(2048.0, gt=0, description="prediction before anything was observed")
    history_per_prompt: int = Field(64, ge=1, description="group_history: finished lengths kept per prompt")
    history_global: int = Field(4096, ge=1, description="group_history: finished lengths kept overall")
    hash_buckets: int = Field(128, ge=8, description="learned: hashed n-gram buckets per text field")
    max_rows: int = Field(50000, ge=1, description="learned: newest training rows kept")
    refit_every: int = Field(512, ge=1, description="learned: new rows between background refits")
    min_rows: int = Field(64, ge=2, description="learned: rows needed before the first fit")
    boosting_iterations: int = Field(200, ge=1, description="learned: boosting rounds")
    lm_model: str | None = Field(None, description="lm: Hugging Face causal LM directory to fine-tune from")
    lm_max_tokens: int = Field(1024, ge=8, description="lm: tokens of the rendered messages kept (head and tail)")
    lm_device: str = Field("cpu", description="lm: torch device")
    lm_epochs: int = Field(2, ge=1)
    lm_learning_rate: float = Field(2e-5, gt=0)
    lm_batch_size: int = Field(8, ge=1)
