"""The training side of a run: the policy model and its streaming trainer, behind async
methods (forward/backward run in a worker thread, so the event loop keeps serving rollout).
The local runtime calls it in-process; the Ray runtime hosts it in an actor. With
`trainer.world_size` > 1 the trainer is rank 0 of that many FSDP2 ranks (trainer/fsdp.py)."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from pathlib import Path

import torch
import transformers
from torch import nn

from venusrl.config import Config
from venusrl.model.checkpoint import resolve_dtype
from venusrl.trainer.checkpoint import save_policy
from venusrl.trainer.fsdp import ShardedTrainer
from venusrl.trainer.streaming import GroupResult, StepResult, StreamingTrainer
from venusrl.types import Group

log = logging.getLogger(__name__)


class TrainerService:
    def __init__(self, config: Config, model_dir: Path, version: int = 0, optimizer_state: Path | None = None) -> None:
        transformers.logging.disable_progress_bar()
        self.config = config
        self.tokenizer_dir = Path(config.model.path)
        device = torch.device(config.model.device)
        compute_dtype = resolve_dtype(config.model.dtype)  # the forward's and the engines'; the master is float32
        if compute_dtype == torch.float16:  # its 5 exponent bits flush RL-sized gradients to zero unscaled
            raise ValueError("model.dtype: float16 training needs loss scaling, which the trainer does not do; "
                             "use bfloat16 (or float32)")
        self.trainer: StreamingTrainer | ShardedTrainer
        if config.trainer.world_size > 1:
            self.trainer = ShardedTrainer(config.trainer.world_size, partial(load_policy, config, model_dir),
                                          config.trainer, version, optimizer_state, device.type,
                                          temperature=config.rollout.temperature, compute_dtype=compute_dtype)
        else:
            model, reference = load_policy(config, model_dir, device)
            self.trainer = StreamingTrainer(model, config.trainer, version, reference, config.rollout.temperature,
                                            compute_dtype)
            if optimizer_state is not None:
                self.trainer.optimizer.load_state_dict(torch.load(optimizer_state, weights_only=True))
        log.info("trainer: %s from %s at weight version %d (%d rank(s))", type(self.trainer).__name__, model_dir,
                 version, config.trainer.world_size)

    async def accumulate(self, group: Group) -> GroupResult:
        return await asyncio.to_thread(self.trainer.accumulate, group)

    async def step(self) -> StepResult:
        return await asyncio.to_thread(self.trainer.step)

    async def weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights by Hugging Face name for a push (weights/pusher.py): its live
        parameters where the trainer is one model here (no copy: each transport reads them
        during the push, which the driver awaits before the next step), else the FSDP ranks'
        weights gathered to host memory."""
        if isinstance(self.trainer, ShardedTrainer):
            return await asyncio.to_thread(self.trainer.engine_weights)
        return {name: tensor.detach() for name, tensor in self.trainer.model.state_dict().items()}

    async def save(self, directory: Path) -> None:
        if isinstance(self.trainer, ShardedTrainer):
            await asyncio.to_thread(self.trainer.save, directory, self.tokenizer_dir)
        else:
            await asyncio.to_thread(save_policy, directory, self.trainer.model, self.tokenizer_dir, self.trainer.optimizer)


def load_policy(config: Config, model_dir: Path, device: torch.device) -> tuple[nn.Module, nn.Module | None]:
    """The policy from `model_dir` on `device`, in float32 (the master weights the optimizer
    updates, whatever model.dtype computes in), and, with a KL term, the frozen reference model in
    model.dtype; every FSDP rank builds its own copy with it."""
    torch.manual_seed(config.run.seed)
    dtype = resolve_dtype(config.model.dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    reference = None
    if config.trainer.kl_coef > 0:  # KL to the initial policy, not to a resumed one
        reference = transformers.AutoModelForCausalLM.from_pretrained(config.model.path, dtype=dtype)
        reference = reference.to(device).eval().requires_grad_(False)
    return model, reference
