"""GRPO/PPO losses in one readable module, each term named as in the literature.

Notation, per sampled token t of a trajectory:
  logp      log π_θ(t)       the policy being trained (carries the gradient)
  logp_old  log π_θ_old(t)   the trainer's policy when this optimizer step began (proximal)
  logp_mu   log μ(t)         the rollout engine's policy when it sampled t (behaviour)
  A         the advantage of the token's trajectory

  r   = exp(logp − logp_old)                       PPO ratio (Schulman et al. 2017)
  L   = −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A) clipped surrogate, clip-higher (DAPO)
  ρ   = exp(logp_old − logp_mu)                    trainer/behaviour ratio; rollouts are
                                                   sampled by a stale, numerically different μ
  w   = min(ρ, C)                                  truncated importance sampling (Yao et al.
                                                   2025), detached, multiplies L
  keep = ρ ∈ [ρ_low, ρ_high]                       IcePop: tokens outside are masked out
  k3  = exp(ref − logp) − (ref − logp) − 1          KL(π_θ‖π_ref) estimator (Schulman 2020)
  per-token loss = w·L + β·k3 − c_H·H

The loss is returned as a token *sum*: the streaming trainer backpropagates each group's sum
as it arrives and divides the accumulated gradient by the batch's token count at the
optimizer step, which gives the exact token mean over the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

import torch

from venusrl.trainer.config import PolicyLossConfig

AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo"]


def group_advantages(
    rewards: torch.Tensor, estimator: AdvantageEstimator = "grpo", eps: float = 1e-6
) -> torch.Tensor:
    """Advantages of one group's rewards [K], or of G groups [G, K] (groups along dim 0).

    grpo:    (r − mean) / (std + eps), std with correction=0 (the group's own spread, so
             rewards [1, 0, 0, 1] give exactly ±1); TRL and verl use the unbiased std,
             which scales every advantage by sqrt((K−1)/K).
    dr_grpo: r − mean (Liu et al. 2025: no std division, which favours easy/hard groups).
    rloo:    r_i − mean of the other K−1 rewards (Ahmadian et al. 2024); K ≥ 2.
    A group whose rewards are all equal carries no signal and gets exact zeros.
    """
    if rewards.dim() not in (1, 2) or rewards.shape[-1] == 0:
        raise ValueError(f"rewards must be [K] or [G, K] with K ≥ 1, got shape {tuple(rewards.shape)}")
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    k = rewards.shape[-1]
    mean = rewards.mean(-1, keepdim=True)
    if estimator == "grpo":
        advantages = (rewards - mean) / (rewards.std(-1, keepdim=True, correction=0) + eps)
    elif estimator == "dr_grpo":
        advantages = rewards - mean
    elif estimator == "rloo":
        if k < 2:
            raise ValueError("rloo needs at least 2 rewards per group")
        advantages = rewards - (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r} (grpo, dr_grpo, rloo)")
    # mean() of equal floats can be off by an ulp, which the std division would blow up
    degenerate = (rewards.amax(-1, keepdim=True) == rewards.amin(-1, keepdim=True))
    return advantages.masked_fill(degenerate, 0.0)


def _mean(total: float, count: int) -> float:
    return total / count if count else float("nan")


@dataclass(slots=True)
class PolicyLossStats:
    """Sums and counts, so that the stats of several groups merge exactly. `tokens` counts
    the masked (generated) tokens, `active_tokens` those IcePop kept; the per-token means are
    over active tokens except `behaviour_kl` (all masked tokens)."""

    tokens: int = 0
    active_tokens: int = 0
    clipped: int = 0  # active tokens whose gradient the PPO clip removes
    tis_weight_sum: float = 0.0
    ratio_sum: float = 0.0
    behaviour_kl_sum: float = 0.0
    kl_sum: float = 0.0
    kl_tokens: int = 0  # active tokens when ref_logprobs was given, else 0
    entropy_sum: float = 0.0
    entropy_tokens: int = 0  # active tokens when entropy was given, else 0

    def merge(self, other: PolicyLossStats) -> PolicyLossStats:
        return PolicyLossStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def clip_fraction(self) -> float:
        return _mean(self.clipped, self.active_tokens)

    @property
    def tis_weight_mean(self) -> float:
        return _mean(self.tis_weight_sum, self.active_tokens)

    @property
    def icepop_masked_fraction(self) -> float:
        return _mean(self.tokens - self.active_tokens, self.tokens)

    @property
    def ratio_mean(self) -> float:
        return _mean(self.ratio_sum, self.active_tokens)

    @property
    def behaviour_kl(self) -> float:
        """k3 estimate of KL(μ‖π_θ_old) on the sampled tokens: ρ − 1 − log ρ ≥ 0, the
        rollout/train mismatch (staleness plus numerics)."""
        return _mean(self.behaviour_kl_sum, self.tokens)

    @property
    def kl_mean(self) -> float:
        return _mean(self.kl_sum, self.kl_tokens)

    @property
    def entropy_mean(self) -> float:
        return _mean(self.entropy_sum, self.entropy_tokens)

    def as_dict(self) -> dict[str, float]:
        """The means, leaving out those with nothing counted (no ref model, no entropy)."""
        names = ("clip_fraction", "tis_weight_mean", "icepop_masked_fraction", "ratio_mean",
                 "behaviour_kl", "kl_mean", "entropy_mean")
        values = {name: getattr(self, name) for name in names}
        return {name: value for name, value in values.items() if not math.isnan(value)}


@dataclass(slots=True)
class PolicyLossTerms:
    loss_sum: torch.Tensor  # scalar, with grad: Σ over mask ∧ IcePop-kept tokens
    tokens: int  # masked tokens *before* IcePop: a masked-out token loses its gradient
    #              without re-weighting the others (the IcePop paper's normaliser)
    stats: PolicyLossStats


def policy_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyLossConfig,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> PolicyLossTerms:
    """Tensors [N] (flattened tokens) or [B, T]; `advantages` broadcastable to them (per
    token, or [B, 1] per sequence); `mask` True on generated tokens. Only `logprobs` and
    `entropy` carry gradients."""
    mask = mask.bool()
    advantages = advantages.detach().to(logprobs.dtype)
    # Positions outside the mask may hold anything (padding, prompt log-probs of 0.0):
    # zero their log-ratios so exp() cannot overflow into the graph.
    log_ratio = torch.where(mask, logprobs - proximal_logprobs.detach(), 0.0)
    ratio = log_ratio.exp()
    surrogate = ratio * advantages
    clipped_surrogate = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high) * advantages
    pg_loss = -torch.minimum(surrogate, clipped_surrogate)

    log_rho = torch.where(mask, proximal_logprobs - behaviour_logprobs, 0.0).detach().to(logprobs.dtype)
    rho = log_rho.exp()
    tis_weight = rho.clamp(max=config.tis_cap) if config.tis_cap is not None else torch.ones_like(rho)
    keep = mask.clone()
    if config.icepop_low is not None:
        keep &= rho >= config.icepop_low
    if config.icepop_high is not None:
        keep &= rho <= config.icepop_high

    per_token = tis_weight * pg_loss
    kl = None
    if ref_logprobs is not None:
        log_ref_ratio = torch.where(mask, ref_logprobs.detach() - logprobs, 0.0)
        kl = log_ref_ratio.exp() - log_ref_ratio - 1.0
        per_token = per_token + config.kl_coef * kl
    if entropy is not None:
        per_token = per_token - config.entropy_coef * entropy
    loss_sum = torch.where(keep, per_token, 0.0).sum()

    with torch.no_grad():
        def kept_sum(values: torch.Tensor) -> torch.Tensor:
            return torch.where(keep, values.detach().double(), 0.0).sum()

        sums = [
            mask.sum(), keep.sum(), ((clipped_surrogate < surrogate) & keep).sum(),
            kept_sum(tis_weight), kept_sum(ratio),
            torch.where(mask, rho - 1.0 - log_rho, 0.0).double().sum(),
            kept_sum(kl) if kl is not None else torch.zeros(()),
            kept_sum(entropy) if entropy is not None else torch.zeros(()),
        ]
        (tokens, active, clipped, tis_sum, ratio_sum, behaviour_kl_sum, kl_sum, entropy_sum) = (
            torch.stack([s.to(device=logprobs.device, dtype=torch.float64) for s in sums]).tolist()
        )
    stats = PolicyLossStats(
        tokens=int(tokens), active_tokens=int(active), clipped=int(clipped),
        tis_weight_sum=tis_sum, ratio_sum=ratio_sum, behaviour_kl_sum=behaviour_kl_sum,
        kl_sum=kl_sum, kl_tokens=int(active) if kl is not None else 0,
        entropy_sum=entropy_sum, entropy_tokens=int(active) if entropy is not None else 0,
    )
    return PolicyLossTerms(loss_sum=loss_sum, tokens=int(tokens), stats=stats)


def token_logprobs_and_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(label) and the entropy of the next-token distribution, both [B, T] in float32.

    `logits[b, t]` must already predict `labels[b, t]` (shift before calling). Negative
    labels (the -100 ignore index) get log-prob 0. One float32 log_softmax over [B, T, V] is
    the peak extra memory; callers with long sequences chunk over T.
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    valid = labels >= 0
    token_logprobs = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return torch.where(valid, token_logprobs, 0.0), entropy
