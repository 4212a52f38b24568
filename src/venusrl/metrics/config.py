"""The `metrics` section of the config."""

from __future__ import annotations

from pydantic import Field

from venusrl.schema import Section


class MetricsConfig(Section):
    tensorboard: bool = Field(False, description="also write step/eval scalars as TensorBoard events (pip install venusrl[tensorboard])")
    wandb_project: str | None = Field(None, description="also log step/eval scalars to this Weights & Biases project (pip install venusrl[wandb])")
    log_every_steps: int = Field(1, ge=1, description="optimizer steps between step records")
