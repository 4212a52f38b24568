"""The training side of a run: the policy model and its streaming trainer, behind async
methods (forward/backward run in a worker thread, so the event loop keeps serving rollout).
The local runtime calls it in-process; the Ray runtime hosts it in an actor."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import torch
import transformers

from venusrl.config import Config
from venusrl.model.checkpoint import resolve_dtype
from venusrl.trainer.checkpoint import save_policy
from venusrl.trainer.streaming import GroupResult, StepResult, StreamingTrainer
from venusrl.types import Group

log = logging.getLogger(__name__)


class TrainerService:
    def __init__(self, config: Config, model_dir: Path, version: int = 0, optimizer_state: Path | None = None) -> None:
        transformers.logging.disable_progress_bar()
        torch.manual_seed(config.run.seed)
        self.config = config
        self.tokenizer_dir = Path(config.model.path)
        dtype = resolve_dtype(config.model.dtype)
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(config.model.device)
        reference = None
        if config.trainer.kl_coef > 0:  # KL to the initial policy, not to a resumed one
            reference = transformers.AutoModelForCausalLM.from_pretrained(self.tokenizer_dir, dtype=dtype)
            reference = reference.to(config.model.device).eval().requires_grad_(False)
        self.trainer = StreamingTrainer(model, config.trainer, version, reference)
        if optimizer_state is not None:
            self.trainer.optimizer.load_state_dict(torch.load(optimizer_state, weights_only=True))
        log.info("trainer: %s from %s at weight version %d", type(model).__name__, model_dir, version)

    async def accumulate(self, group: Group) -> GroupResult:
        return await asyncio.to_thread(self.trainer.accumulate, group)

    async def step(self) -> StepResult:
        return await asyncio.to_thread(self.trainer.step)

    async def weights(self) -> dict[str, torch.Tensor]:
        return await asyncio.to_thread(self.trainer.engine_weights)

    async def save(self, directory: Path) -> None:
        await asyncio.to_thread(save_policy, directory, self.trainer.model, self.tokenizer_dir, self.trainer.optimizer)
