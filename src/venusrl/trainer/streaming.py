"""Streaming GRPO/PPO trainer on a Hugging Face causal LM.

Each finished group is trained on the moment it arrives: its advantages come from its own K
rewards, its token-sum loss is backpropagated and the gradient accumulates. When B groups are
in, `step` divides the accumulated gradient by the batch's token count (an exact token mean
over the batch), clips, takes the optimizer step and increments the weight version; the
caller then pushes `engine_weights()` to the engines.

Invariant: the weights do not change between two steps, so the proximal policy π_θ_old of
every group in a batch is the current π_θ and its log-probs are computed in the same
forward pass (ratio exactly 1, the PPO gradient A·∇log π). The off-policy part, rollouts
sampled by older engine weights, is corrected by TIS and IcePop against the behaviour
log-probs the engine recorded.

The policy is the distribution the rollouts were sampled from, softmax(logits / T) at the
rollout temperature T: the engine records its log-probs under that distribution, so the
trainer divides its logits by the same T. Without it, at T ≠ 1 every on-policy token would
look off-policy (ρ = π_1/π_T ≠ 1: IcePop masks and TIS re-weights the tokens it should
keep) and the gradient would be that of another distribution than the one sampled.

Mixed precision: the model's parameters, their gradients and the optimizer state are float32
(the master copy: an RL step at lr 1e-6 is below bf16's resolution and would round away); the
forward runs under autocast in `compute_dtype` (model.dtype, bf16 on GPUs), and the engines get
the weights in that dtype (`engine_weights`). A checkpoint keeps the float32 master, so a resumed
run continues bit for bit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from venusrl.trainer.config import TrainerConfig
from venusrl.trainer.losses import PolicyLossConfig, PolicyLossStats, group_advantages, policy_loss
from venusrl.trainer.policy_forward import PolicyForward
from venusrl.trainer.rows import Rows, packed_rows, packs_rows, padded_rows
from venusrl.trainer.shared_prefix import common_prefix_length
from venusrl.types import Group, Trajectory

log = logging.getLogger(__name__)


@dataclass(slots=True)
class GroupResult:
    group_id: int
    reward_mean: float
    tokens: int  # generated tokens trained on
    skipped: bool  # every reward equal: no signal, no backward pass
    loss_sum: float
    stats: PolicyLossStats


@dataclass(slots=True)
class StepResult:
    version: int
    groups: int
    trajectories: int
    tokens: int
    loss: float  # token mean over the batch
    grad_norm: float
    reward_mean: float
    reward_std: float
    skipped_groups: int
    seconds: float
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Accumulated:
    groups: list[GroupResult] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    tokens: int = 0
    loss_sum: float = 0.0
    stats: PolicyLossStats = field(default_factory=PolicyLossStats)
    started: float = field(default_factory=time.monotonic)


class StreamingTrainer:
    def __init__(
        self, model: nn.Module, config: TrainerConfig, version: int = 0, reference: nn.Module | None = None,
        temperature: float = 1.0, compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        """`model`: float32 parameters (the master copy); `reference`: frozen, in any dtype;
        `temperature`: the rollout's sampling temperature (0, greedy, records log_softmax of the
        plain logits, as 1 does); `compute_dtype`: of the forward and of `engine_weights`."""
        if config.kl_coef > 0 and reference is None:
            raise ValueError("trainer.kl_coef > 0 needs a reference model")
        if temperature < 0:
            raise ValueError(f"temperature must be ≥ 0, got {temperature}")
        not_master = {p.dtype for p in model.parameters() if p.requires_grad} - {torch.float32}
        if not_master:
            raise ValueError(f"the policy's parameters must be float32 (the master copy; compute_dtype sets the "
                             f"forward's), got {sorted(map(str, not_master))}")
        if config.activation_checkpointing:
            if not getattr(model, "supports_gradient_checkpointing", False):
                raise ValueError(f"trainer.activation_checkpointing: {type(model).__name__} does not support it")
            if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x; the older name warns there
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model, self.config, self.version = model, config, version
        self.temperature = temperature if temperature > 0 else 1.0
        self.compute_dtype = compute_dtype
        self.loss_config: PolicyLossConfig = config  # the trainer section is the loss config
        self._device = next(model.parameters()).device
        self._pack = packs_rows(config.pack_rows, getattr(model.config, "_attn_implementation", None))
        self.policy = PolicyForward(model, config.logprob_chunk_tokens, self.temperature, compute_dtype)
        self.reference_policy = (PolicyForward(reference, config.logprob_chunk_tokens, self.temperature, compute_dtype)
                                 if reference is not None else None)
        self._place()
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=config.learning_rate,
            betas=config.adam_betas, weight_decay=config.weight_decay)
        self._batch = _Accumulated()
        self.model.train()

    def _place(self) -> None:
        """Where the data-parallel trainer shards `policy` and `reference_policy`, before the
        optimizer takes the parameters; one process keeps them as they are."""

    def accumulate(self, group: Group) -> GroupResult:
        """Backpropagate one ready group's loss into the accumulated gradient."""
        trajectories = group.trajectories
        rewards = torch.tensor([_reward(t) for t in trajectories], dtype=torch.float32)
        advantages = group_advantages(rewards, self.config.advantage)
        self._batch.rewards += rewards.tolist()
        tokens = sum(sum(t.generated_mask) for t in trajectories)
        needs_pass = bool(advantages.abs().max() > 0) or self.config.kl_coef > 0 or self.config.entropy_coef > 0
        loss_sum, stats = self._forward_backward(trajectories, advantages) if needs_pass else (0.0, PolicyLossStats())
        result = GroupResult(group.id, float(rewards.mean()), tokens, not needs_pass, loss_sum, stats)
        self._batch.groups.append(result)
        self._batch.tokens += tokens
        self._batch.loss_sum += loss_sum
        self._batch.stats = self._batch.stats.merge(stats)
        return result

    def step(self) -> StepResult:
        """Optimizer step on the accumulated groups; the weight version increments."""
        batch = self._batch
        if not batch.groups:
            raise RuntimeError("step() with no accumulated group")
        scale = 1.0 / max(batch.tokens, 1)
        params = [p for p in self.model.parameters() if p.grad is not None]
        for p in params:
            p.grad.mul_(scale)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)) if params else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        rewards = torch.tensor(batch.rewards)
        result = StepResult(
            version=self.version, groups=len(batch.groups), trajectories=len(batch.rewards), tokens=batch.tokens,
            loss=batch.loss_sum * scale, grad_norm=grad_norm, reward_mean=float(rewards.mean()),
            reward_std=float(rewards.std(correction=0)), skipped_groups=sum(g.skipped for g in batch.groups),
            seconds=time.monotonic() - batch.started, stats=batch.stats.as_dict())
        self._batch = _Accumulated()
        log.info("step to weight version %d: %d groups, %d tokens, loss %.4f, reward %.3f, grad norm %.3f",
                 result.version, result.groups, result.tokens, result.loss, result.reward_mean, grad_norm)
        return result

    @torch.no_grad()
    def engine_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the weights by Hugging Face name in the compute dtype, safe to hand to engine
        threads while the trainer goes on."""
        return {name: engine_copy(tensor, self.compute_dtype) for name, tensor in self.model.state_dict().items()}

    def _forward_backward(self, trajectories: list[Trajectory], advantages: torch.Tensor) -> tuple[float, PolicyLossStats]:
        """Backpropagate a group's loss in micro-batches; the group's loss sum and stats. The
        data-parallel trainer (trainer/fsdp.py) overrides it to train its share of the rows."""
        loss_sum, stats = 0.0, PolicyLossStats()
        for micro in self._plan(trajectories, range(len(trajectories))):
            rows = [trajectories[i] for i in micro]
            terms_loss, terms_stats = self._backward(rows, advantages[micro], self._shared_prefix(rows))
            loss_sum += terms_loss
            stats = stats.merge(terms_stats)
        return loss_sum, stats

    def _plan(self, trajectories: list[Trajectory], rows: Iterable[int]) -> list[list[int]]:
        """`rows` of the group, shortest first, cut into micro-batches of at most micro_batch_tokens
        (padded size, or real tokens when rows are packed)."""
        order = sorted(rows, key=lambda i: len(trajectories[i].token_ids))
        return _micro_batches(order, [len(trajectories[i].token_ids) for i in order], self.config.micro_batch_tokens,
                              padded=not self._pack)

    def _shared_prefix(self, trajectories: list[Trajectory]) -> int:
        """Leading tokens a micro-batch's forward computes once; 0 means one plain forward call
        (a single row, too short a common prefix, layers recomputed in backward, which cannot
        extend a KV cache, or packed rows: `_plan` sized the micro-batch by its real tokens, and a
        shared prefix lays it out padded), any other value two calls."""
        if self.config.activation_checkpointing or self._pack or len(trajectories) < 2:
            return 0
        prefix = common_prefix_length([t.token_ids for t in trajectories])
        return prefix if prefix >= self.config.shared_prefix_min_tokens else 0

    def _layout(self, trajectories: list[Trajectory], advantages: torch.Tensor, prefix: int) -> Rows:
        if self._pack and len(trajectories) > 1:
            return packed_rows(trajectories, advantages).to(self._device)
        return padded_rows(trajectories, advantages, prefix).to(self._device)

    def _backward(
        self, trajectories: list[Trajectory], advantages: torch.Tensor, prefix: int
    ) -> tuple[float, PolicyLossStats]:
        rows = self._layout(trajectories, advantages, prefix)
        autocast = torch.autocast(self._device.type, dtype=self.compute_dtype,
                                  enabled=self.compute_dtype != torch.float32)
        with autocast:
            logprobs, entropy = self.policy(rows)
        reference = None
        if self.reference_policy is not None:
            with torch.no_grad(), autocast:
                reference, _ = self.reference_policy(rows)
        terms = policy_loss(logprobs, logprobs.detach(), rows.behaviour, rows.advantages, rows.mask,
                            self.loss_config, ref_logprobs=reference, entropy=entropy)
        terms.loss_sum.backward()
        return float(terms.loss_sum.detach()), terms.stats


def _reward(trajectory: Trajectory) -> float:
    if trajectory.reward is None:
        raise ValueError(f"trajectory {trajectory.id} of group {trajectory.group_id} has no reward")
    return trajectory.reward


def engine_copy(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A fresh CPU copy, floating-point tensors in `dtype` (the engines' and the compute dtype)."""
    return tensor.detach().to("cpu", dtype=dtype if tensor.is_floating_point() else tensor.dtype, copy=True)


def _micro_batches(order: list[int], lengths: list[int], max_tokens: int, padded: bool = True) -> list[list[int]]:
    """Consecutive runs of `order` whose size stays under max_tokens: rows x longest when
    `padded`, else the sum of the lengths; a sequence longer than the bound gets a micro-batch
    of its own."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = total = 0
    for index, length in zip(order, lengths, strict=True):
        size = (len(current) + 1) * max(longest, length) if padded else total + length
        if current and size > max_tokens:
            batches.append(current)
            current, longest, total = [], 0, 0
        current.append(index)
        longest, total = max(longest, length), total + length
    if current:
        batches.append(current)
    return batches
