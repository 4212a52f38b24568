"""The `trainer` section of the config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from venusrl.schema import Section


class TrainerConfig(Section):
    advantage: Literal["grpo", "dr_grpo", "rloo"] = Field(
        "grpo", description="group-normalised advantages: grpo (mean/std), dr_grpo (mean only), rloo (leave-one-out)")
    learning_rate: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping by global norm")
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clip below 1")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio clip above 1 (clip-higher)")
    tis_cap: float | None = Field(2.0, gt=0, description="truncated importance sampling cap on trainer/behaviour ratio; null: off")
    icepop_low: float | None = Field(0.5, gt=0, description="IcePop: mask tokens whose trainer/behaviour ratio is below; null: off")
    icepop_high: float | None = Field(2.0, gt=0, description="IcePop: mask tokens whose trainer/behaviour ratio is above; null: off")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the initial (reference) model; 0: no reference model is kept")
    entropy_coef: float = Field(0.0, ge=0)
    shared_prefix_min_tokens: int = Field(
        16, ge=1, description="a micro-batch whose rows share at least this many leading tokens (a group's "
        "prompt) computes them once")
    micro_batch_tokens: int = Field(8192, ge=16, description="tokens per forward/backward (memory bound)")
    world_size: int = Field(1, ge=1, description="data-parallel FSDP2 ranks (one process and device each); "
                            "1 = single process")
    collective_timeout_s: float = Field(
        600.0, gt=0, description="FSDP2: longest wait in one collective; a rank stuck longer fails the step")
    steps: int | None = Field(None, ge=1, description="optimizer steps to run; null: until the dataset is used up")
    epochs: int = Field(1, ge=1, description="passes over the training dataset")
    checkpoint_every_steps: int = Field(1, ge=1)
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on disk")
    eval_every_steps: int = Field(0, ge=0, description="held-out evaluation every N steps (0: before and after only)")
