"""Turn logits into a token and the log-probability the trainer needs.

Every request's parameters reach here; none may turn into NaN probabilities or an
overflowing seed. A temperature too small to divide by is greedy (vLLM draws the same line);
a seed of any size is folded into the generator's 64 bits."""

from __future__ import annotations

import torch

from venusrl.types import SamplingParams

# Below this temperature sampling is greedy: logits / T would overflow float32 (and float16
# far sooner) into inf - inf = NaN, and the distribution is an argmax to within rounding.
GREEDY_BELOW = 1e-5
_SEED_SPACE = 2**64  # torch.Generator.manual_seed takes [0, 2**64)


class SamplingError(ValueError):
    """One request's sampling failed (non-finite logits or probabilities); only it fails."""


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < GREEDY_BELOW


def position_seed(seed: int, position: int) -> int:
    """The generator seed of output token `position` for a request seeded `seed`: the same
    across retraction and resume, and inside the generator's range for every integer seed."""
    return (seed + position) % _SEED_SPACE


def greedy(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """logits: [N, V]. The argmax of each row and its log-probability, in one pass for the
    whole batch (per-row calls cost more than the math at decode batch sizes)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    return tokens.tolist(), logprobs.gather(1, tokens[:, None])[:, 0].tolist()


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[int, float]:
    """logits: [V] for one position. Returns (token, log-prob under the sampling distribution
    before top-p/top-k truncation, i.e. softmax(logits / temperature)). Raises
    `SamplingError` when the logits give no distribution to draw from."""
    logits = logits.float()
    if is_greedy(params):
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
        drop[0] = False  # a top_p below float32's smallest value (1e-300) rounds to 0 and would drop it too
        candidates[order[drop]] = float("-inf")
    probs = torch.softmax(candidates, dim=-1)
    if not bool(torch.isfinite(probs).all()):
        raise SamplingError(f"sampling at temperature {params.temperature}: the probabilities are not finite "
                            f"({int(torch.isnan(logits).sum())} NaN logits)")
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])
