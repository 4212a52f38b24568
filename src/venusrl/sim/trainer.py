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
    group_s: float = 0.0  # per group on top of its tokens (the rollout bench's trainer: all of it)


def trainer_preset(model: str, gpus: int, mfu: float = 0.35, gpu: GpuSpec = H100) -> TrainerCost:
    """8 x params FLOPs per token: forward, backward and the old-log-prob forward."""
    params = MODELS[model].params
    return TrainerCost(token_s=8 * params / (gpus * gpu.flops * mfu), step_s=2.0 + params * 2 / 50e9)


@dataclass(slots=True)
class StreamingTrainerClock:
    """When a streaming trainer finishes each optimizer step: it computes each group's
    gradients when the group arrives, one group at a time in arrival order, and steps when
    B groups are through. Pure arithmetic; the simulator and the rollout bench drive it."""

    batch_groups: int
    free_at: float = 0.0  # when the gradient pipeline is next free
    in_step: int = 0  # groups through it for the next step

    def add_group(self, now: float, gradient_s: float, step_s: float) -> float | None:
        """A group arrived at `now` and costs `gradient_s`; when it completes a batch, the
        time the step (`step_s` more: optimizer step and weight push) is done."""
        self.free_at = max(self.free_at, now) + gradient_s
        self.in_step += 1
        if self.in_step < self.batch_groups:
            return None
        self.in_step = 0
        self.free_at += step_s
        return self.free_at


@dataclass(slots=True)
class SimTrainer:
    loop: EventLoop
    cost: TrainerCost
    batch_groups: int
    on_step: Callable[[int], None]  # new weight version
    version: int = 0
    step_times: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    _clock: StreamingTrainerClock = field(init=False)
    _tokens: int = 0

    def __post_init__(self) -> None:
        self._clock = StreamingTrainerClock(self.batch_groups)

    def add_group(self, tokens: int) -> None:
        self._tokens += tokens
        done_at = self._clock.add_group(self.loop.now, tokens * self.cost.token_s + self.cost.group_s,
                                         self.cost.step_s)
        if done_at is not None:
            tokens, self._tokens = self._tokens, 0
            self.loop.at(done_at, lambda: self._stepped(tokens))

    def _stepped(self, tokens: int) -> None:
        self.version += 1
        self.step_times.append(self.loop.now)
        self.step_tokens.append(tokens)
        self.on_step(self.version)
