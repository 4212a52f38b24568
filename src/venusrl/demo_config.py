"""The `demo` section: how `venusrl demo` builds and warm-starts its tiny model before it
trains with the rest of the config."""

from __future__ import annotations

from pydantic import Field

from venusrl.schema import Section


class DemoConfig(Section):
    workdir: str = Field("runs/demo", description="tiny model, SFT model and the run directory go here")
    model_hidden: int = Field(96, ge=16)
    model_layers: int = Field(3, ge=1)
    model_heads: int = Field(4, ge=1)
    model_kv_heads: int = Field(2, ge=1)
    rope_theta: float = Field(10000.0, gt=0)
    sft_examples: int = Field(768, ge=1, description="generated demonstrations for the warm start")
    sft_epochs: int = Field(3, ge=1)
    sft_learning_rate: float = Field(3e-3, gt=0)
    sft_batch_size: int = Field(4, ge=1)
    sft_seed: int = Field(100, description="seed of the demonstrations' problems (apart from train and held-out)")
    sft_ungraded_fraction: float = Field(
        0.0, ge=0.0, le=1.0,
        description="demonstrations that end 'The result is N.', a form the grader does not accept")
    teacher_swap_fraction: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="demonstrations with a subtraction that call it with the operands swapped and answer the wrong "
                    "number (an imperfect teacher); below 1, so the right order is demonstrated at all")
    sft_model: str | None = Field(
        None, description="an SFT model directory (WORKDIR/sft of an earlier run of this config) to start RL from "
                          "instead of building and warm-starting one; the run then measures RL seeds on one warm start")
    eval_samples: int = Field(1, ge=1, description="sampled (rollout temperature) held-out rollouts per problem, "
                                                   "besides the greedy one")
