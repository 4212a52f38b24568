"""The trainer as a time model: streaming gradients, one optimizer step per B groups.

Each ready group's gradients are computed as it arrives, one group after another (the
training GPUs are one pipeline); when B groups have been through it the optimizer steps,
the weight version increments and `on_step` is told.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from venusrl.sim.cost_model import H100, MODELS, GpuSpec
from venusrl.sim.events import EventLoop


@dataclass(slots=True, frozen=True)
class TrainerCost:
    token_s: float  # forward + backward (+ log-prob recompute) per trained token
    step_s: float  # optimizer step and weight broadcast


def trainer_preset(model: str, gpus: int, mfu: float = 0.35, gpu: GpuSpec = H100) -> TrainerCost:
    """8 x params FLOPs per token: forward, backward and the old-log-prob forward."""
    params = MODELS[model].params
    return TrainerCost(token_s=8 * params / (gpus * gpu.flops * mfu), step_s=2.0 + params * 2 / 50e9)


@dataclass(slots=True)
class SimTrainer:
    loop: EventLoop
    cost: TrainerCost
    batch_groups: int
    on_step: Callable[[int], None]  # new weight version
    version: int = 0
    step_times: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    _free_at: float = 0.0
    _in_step: int = 0  # groups through the gradient pipeline for the next step
    _tokens: int = 0

    def add_group(self, tokens: int) -> None:
        self._free_at = max(self._free_at, self.loop.now) + tokens * self.cost.token_s
        self._in_step += 1
        self._tokens += tokens
        if self._in_step == self.batch_groups:
            self._free_at += self.cost.step_s
            tokens, self._in_step, self._tokens = self._tokens, 0, 0
            self.loop.at(self._free_at, lambda: self._stepped(tokens))

    def _stepped(self, tokens: int) -> None:
        self.version += 1
        self.step_times.append(self.loop.now)
        self.step_tokens.append(tokens)
        self.on_step(self.version)
