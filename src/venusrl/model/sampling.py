"""Turn logits into a token and the log-probability the trainer needs."""

from __future__ import annotations

import torch

from venusrl.types import SamplingParams


def greedy(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """logits: [N, V]. The argmax of each row and its log-probability, in one pass for the
    whole batch (per-row calls cost more than the math at decode batch sizes)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    return tokens.tolist(), logprobs.gather(1, tokens[:, None])[:, 0].tolist()


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[int, float]:
    """logits: [V] for one position. Returns (token, log-prob under the sampling distribution
    before top-p/top-k truncation, i.e. softmax(logits / temperature))."""
    logits = logits.float()
    if params.temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return token, float(logprobs[token])
    scaled = logits / params.temperature
    logprobs = torch.log_softmax(scaled, dim=-1)
    candidates = scaled.clone()
    if params.top_k:
        kth = torch.topk(candidates, min(params.top_k, candidates.numel())).values[-1]
        candidates[candidates < kth] = float("-inf")
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(candidates, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p
        candidates[order[drop]] = float("-inf")
    probs = torch.softmax(candidates, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])
