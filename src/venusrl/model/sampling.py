"""Turn logits into tokens and the log-probabilities the trainer needs, for a whole batch on
the logits' device: no per-row host work, and the caller copies the result to the host once.

Every request's parameters reach here; none may turn into NaN probabilities or an
overflowing seed. A temperature too small to divide by is greedy (vLLM draws the same line);
a seed of any size is folded into 64 bits.

Sampling is the Gumbel-max trick: token = argmax(logits / T + g) with g = -log(-log u) draws
exactly from softmax(logits / T) (restricted to the top-k / top-p candidates). u comes from a
counter-based hash of (the row's seed, the token id), so a seeded request draws the same
tokens on any device and batch, and the whole batch draws in a few elementwise ops instead
of one generator per row."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from venusrl.types import SamplingParams

# Below this temperature sampling is greedy: logits / T would overflow float32 (and float16
# far sooner) into inf - inf = NaN, and the distribution is an argmax to within rounding.
GREEDY_BELOW = 1e-5
_SEED_SPACE = 2**64
# splitmix64's constants as signed 64-bit integers (torch has no uint64 arithmetic)
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MIX1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX2 = 0x94D049BB133111EB - 2**64


class SamplingError(ValueError):
    """One request's sampling failed (non-finite logits or probabilities); only it fails."""


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < GREEDY_BELOW


def position_seed(seed: int, position: int) -> int:
    """The seed of output token `position` for a request seeded `seed`: the same across
    retraction and resume, and inside 64 bits for every integer seed."""
    return (seed + position) % _SEED_SPACE


def as_int64(seed: int) -> int:
    """A seed in [0, 2**64) as the signed 64-bit integer with the same bits."""
    return seed - _SEED_SPACE if seed >= 2**63 else seed


@dataclass(slots=True)
class SamplingRows:
    """Each row's parameters on the device. Host flags skip work no row needs."""

    # None, all of them, when every row is greedy
    temperature: torch.Tensor | None  # [N] float32; 1 for greedy rows
    greedy: torch.Tensor | None  # [N] bool
    top_k: torch.Tensor | None  # [N] int64; 0: off
    top_p: torch.Tensor | None  # [N] float32; inf: off
    seeds: torch.Tensor | None  # [N] int64
    all_greedy: bool
    any_truncation: bool

    @classmethod
    def build(cls, params: list[SamplingParams], seeds: list[int | None], device: torch.device,
              generator: torch.Generator | None) -> SamplingRows:
        """seeds[i]: row i's seed (from `position_seed`), or None to draw one from `generator`.
        A batch of greedy rows only needs no tensor at all."""
        greedy = [is_greedy(p) for p in params]
        if all(greedy):
            return cls(None, None, None, None, None, all_greedy=True, any_truncation=False)
        floats = torch.tensor([[1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)],
                               [p.top_p if p.top_p < 1.0 else float("inf") for p in params]],
                              dtype=torch.float32, device=device)
        integers = torch.tensor([[int(g) for g in greedy], [p.top_k for p in params],
                                 [0 if s is None else as_int64(s) for s in seeds]], dtype=torch.long, device=device)
        row_seeds = integers[2]
        unseeded = [i for i, (s, g) in enumerate(zip(seeds, greedy, strict=True)) if s is None and not g]
        if unseeded:
            drawn = torch.randint(0, 2**62, (len(unseeded),), dtype=torch.long, device=device, generator=generator)
            row_seeds = row_seeds.index_put((torch.tensor(unseeded, device=device),), drawn)
        any_truncation = any(p.top_k or p.top_p < 1.0 for p, g in zip(params, greedy, strict=True) if not g)
        return cls(floats[0], integers[0].bool(), integers[1], floats[1], row_seeds, False, any_truncation)


def _shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer: every input bit flips each output bit with probability ~1/2."""
    x = (x ^ _shift(x, 30)) * _MIX1
    x = (x ^ _shift(x, 27)) * _MIX2
    return x ^ _shift(x, 31)


def uniforms(seeds: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, vocab] float32 in (0, 1): a hash of (seeds[i], token id), 24 random bits each."""
    keys = _mix(seeds)[:, None]
    ids = torch.arange(1, vocab + 1, dtype=torch.long, device=seeds.device) * _GOLDEN
    bits = _shift(_mix(keys + ids), 40)
    return (bits.to(torch.float32) + 0.5) * (1.0 / 2**24)


def _truncate(scaled: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """scaled with every token outside a row's top-k, then outside its top-p mass, at -inf.
    Ties with the k-th value are kept; top-p keeps the smallest prefix whose mass reaches p
    (always at least the top token)."""
    vocab = scaled.shape[-1]
    ordered, order = torch.sort(scaled, dim=-1, descending=True)
    k = torch.where(rows.top_k > 0, rows.top_k.clamp(max=vocab), vocab)
    kth = ordered.gather(1, (k - 1)[:, None])
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    drop = (probs.cumsum(-1) - probs) >= rows.top_p[:, None]
    drop[:, 0] = False  # a top_p below float32's smallest value (1e-300) rounds to 0 and would drop it too
    ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(1, order, ordered)


def sample_rows(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """logits [N, V] -> [N, 3] float32 on the same device (token ids are exact in float32 up to
    2**24): the token, its log-prob under softmax(logits / T) (before top-k/top-p truncation;
    greedy rows: T = 1), and the row's NaN logits where its sampling distribution is not finite
    (-1 where it is: the row is good). Greedy rows are always good."""
    logits = logits.float()
    tokens = torch.argmax(logits, dim=-1)
    if rows.all_greedy:
        picked = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
        return torch.stack([tokens.float(), picked, torch.full_like(picked, -1.0)], dim=1)
    scaled = logits / rows.temperature[:, None]
    candidates = _truncate(scaled, rows) if rows.any_truncation else scaled
    finite = torch.isfinite(torch.softmax(candidates, dim=-1)).all(-1) | rows.greedy
    gumbel = -torch.log(-torch.log(uniforms(rows.seeds, logits.shape[-1])))
    tokens = torch.where(rows.greedy, tokens, torch.argmax(candidates + gumbel, dim=-1))
    failed = torch.where(finite, -1, torch.isnan(logits).sum(-1))
    picked = torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0]
    return torch.stack([tokens.float(), picked, failed.float()], dim=1)


def sampling_error(params: SamplingParams, nan_logits: int) -> SamplingError:
    return SamplingError(f"sampling at temperature {params.temperature}: the probabilities are not finite "
                         f"({nan_logits} NaN logits)")


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[int, float]:
    """One position's logits [V] (the batch path for one row, with its seed drawn from
    `generator`). Returns (token, log-prob as in `sample_rows`); raises `SamplingError` when
    the logits give no distribution to draw from."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator,
                             device=generator.device if generator is not None else "cpu"))
    rows = SamplingRows.build([params], [seed], logits.device, None)
    token, logprob, failed = sample_rows(logits[None], rows)[0].tolist()
    if failed >= 0:
        raise sampling_error(params, int(failed))
    return int(token), logprob
