"""The `trainer` section of the config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from venusrl.schema import Section


class PolicyLossConfig(Section):
    """The coefficients of the loss (`trainer/losses.py`), defined once: `TrainerConfig` (the
    `trainer` section) extends this, so the section a run configures is the loss config the
    trainer passes to `losses.policy_loss`."""

    clip_low: float = Field(0.2, ge=0, lt=1, description="PPO ratio clip below 1 (ε_low: r ≥ 1 − clip_low)")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio clip above 1 (ε_high, clip-higher)")
    tis_cap: float | None = Field(2.0, gt=0, description="truncated importance sampling cap C on the "
                                  "trainer/behaviour ratio; null: off (w = 1)")
    icepop_low: float | None = Field(0.5, gt=0, description="IcePop: mask tokens whose trainer/behaviour ratio "
                                     "is below; null: no lower bound")
    icepop_high: float | None = Field(2.0, gt=0, description="IcePop: mask tokens whose trainer/behaviour ratio "
                                      "is above; null: no upper bound")
    kl_coef: float = Field(0.0, ge=0, description="β: k3 KL to the initial (reference) model; 0: no reference "
                           "model is kept")
    entropy_coef: float = Field(0.0, ge=0, description="c_H: entropy bonus")

    @model_validator(mode="after")
    def _icepop_bounds_ordered(self) -> PolicyLossConfig:
        low, high = self.icepop_low, self.icepop_high
        if low is not None and high is not None and not low < high:
            raise ValueError(f"icepop_low ({low}) must be below icepop_high ({high})")
        return self


class TrainerConfig(PolicyLossConfig):
    """The `trainer` section: the loss's coefficients (`PolicyLossConfig`) and the optimizer,
    batching, parallelism and schedule around it."""

    advantage: Literal["grpo", "dr_grpo", "rloo"] = Field(
        "grpo", description="group-normalised advantages: grpo (mean/std), dr_grpo (mean only), rloo (leave-one-out)")
    learning_rate: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping by global norm")
    shared_prefix_min_tokens: int = Field(
        16, ge=1, description="a micro-batch whose rows share at least this many leading tokens (a group's "
        "prompt) computes them once")
    micro_batch_tokens: int = Field(8192, ge=16, description="tokens per forward/backward (memory bound)")
    logprob_chunk_tokens: int = Field(
        1024, ge=1, description="trained tokens whose [tokens, vocabulary] logits exist at once, forward and "
        "backward (trainer/chunked_logprobs.py): the loss path's memory grows with it, not with the trajectory")
    activation_checkpointing: bool = Field(
        False, description="keep only each decoder layer's input and recompute the layer in backward (about a "
        "third more compute, activation memory of one layer); the shared prompt is then computed per row, "
        "since a layer recomputed in backward cannot extend a KV cache")
    pack_rows: Literal["auto", "on", "off"] = Field(
        "auto", description="a micro-batch's rows concatenated into one row without padding, attention kept "
        "within each by position ids (trainer/rows.py). auto: where the model's attention computes each packed "
        "row on its own (flash attention's varlen kernels, flex attention); sdpa and eager compute the packed "
        "row's whole attention under a block mask, so there auto pads. Rows sharing a prompt compute it once "
        "instead, where they can")
    world_size: int = Field(1, ge=1, description="data-parallel FSDP2 ranks (one process and device each); "
                            "1 = single process")
    collective_timeout_s: float = Field(
        600.0, gt=0, description="FSDP2: longest wait in one collective; a rank stuck longer fails the step")
    steps: int | None = Field(None, ge=1, description="optimizer steps to run; null: until the dataset is used up")
    epochs: int = Field(1, ge=1, description="passes over the training dataset")
    checkpoint_every_steps: int = Field(1, ge=1)
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on disk")
    eval_every_steps: int = Field(0, ge=0, description="held-out evaluation every N steps (0: before and after only)")
