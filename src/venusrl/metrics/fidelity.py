"""Training fidelity of a run, as the paper's Fig. 11 and Fig. 12 show it: reward per step,
and the weight versions trajectories span by trajectory-length percentile, with the share
of the longest trajectories discarded as stale.

Every trajectory attempt counts once: trained ones with the span their turns cover (the
group records' `version_spans` and `trajectory_tokens`), and attempts discarded for
staleness (`stale_discard_tokens` of the summary) in the last row, "discarded", since they
would have spanned more versions than the bound allows. Percentiles are over the lengths
(generated tokens) of all attempts of the run, a discarded one at the length it had reached.

Which prompts each step trained (`trained_composition`): every trained group's prompt placed
by mid-rank percentile among the training dataset's prompts on each measure (difficulty,
length), so a step drawn uniformly from the dataset scores 50 on average and a scheduler that
favours easy or short prompts scores below it."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from venusrl.metrics.run_stats import Record, with_fields

PERCENTILE_BINS = ((0.0, 0.8), (0.8, 0.9), (0.9, 0.95), (0.95, 1.0))  # as in the paper's Fig. 12
BIN_LABELS = tuple(f"{round(lo * 100)}-{round(hi * 100)}%" for lo, hi in PERCENTILE_BINS)


@dataclass(frozen=True, slots=True)
class Attempt:
    tokens: int
    span: int | None  # weight versions spanned; None: discarded as stale


def attempts(groups: list[Record], stale_discard_tokens: list[int]) -> list[Attempt]:
    paired = [g for g in groups if isinstance(g.get("version_spans"), list) and isinstance(g.get("trajectory_tokens"), list)]
    out = [Attempt(int(tokens), int(span))
           for g in paired for span, tokens in zip(g["version_spans"], g["trajectory_tokens"], strict=True)]
    return out + [Attempt(int(tokens), None) for tokens in stale_discard_tokens]


def version_span_heatmap(runs: list[list[Attempt]], max_version_span: int) -> dict:
    """Rows: span 0..max_version_span, then "discarded"; columns: PERCENTILE_BINS of length
    within each run (runs are pooled after ranking, so two seeds count alike). Each column
    holds fractions of that column's attempts (summing to 1), and `counts` the attempts."""
    rows = [str(s) for s in range(max_version_span + 1)] + ["discarded"]
    counts = [[0] * len(PERCENTILE_BINS) for _ in rows]
    for run in runs:
        for column, attempt in zip(_percentile_columns([a.tokens for a in run]), run, strict=True):
            row = len(rows) - 1 if attempt.span is None else min(attempt.span, max_version_span)
            counts[row][column] += 1
    totals = [sum(counts[r][c] for r in range(len(rows))) for c in range(len(PERCENTILE_BINS))]
    fractions = [[counts[r][c] / totals[c] if totals[c] else 0.0 for c in range(len(PERCENTILE_BINS))]
                 for r in range(len(rows))]
    return {"rows": rows, "columns": list(BIN_LABELS), "fractions": fractions, "counts": counts,
            "column_totals": totals, "long_tail_discard_rate": fractions[-1][-1],
            "discard_rate": sum(counts[-1]) / sum(totals) if sum(totals) else 0.0}


def _percentile_columns(lengths: list[int]) -> list[int]:
    """The PERCENTILE_BINS column of each length by its rank (ties broken by position, so
    each bin holds its share of attempts)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    columns = [0] * len(lengths)
    for rank, index in enumerate(order):
        quantile = rank / len(lengths)
        columns[index] = next(c for c, (_, hi) in enumerate(PERCENTILE_BINS) if quantile < hi or hi == 1.0)
    return columns


def reward_per_step(steps: list[Record]) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r["reward_mean"])) for r in with_fields(steps, "step", "reward_mean")]


def reward_per_window(rewards: list[tuple[int, float]], width: int = 10) -> list[float | None]:
    """Mean reward of the step records in steps 1..width, width+1..2*width, ...; None for a
    window without a record (metrics.log_every_steps above the width)."""
    return [None if v is None else round(v, 4) for v in window_means(rewards, width)]


def window_means(points: Iterable[tuple[int, float]], width: int) -> list[float | None]:
    """Mean of the values whose step falls in each window of `width` steps (window k holds
    steps k*width+1 .. (k+1)*width), up to the last step's window."""
    windows: dict[int, list[float]] = {}
    for step, value in points:
        windows.setdefault((step - 1) // width, []).append(value)
    if not windows:
        return []
    return [statistics.fmean(windows[k]) if k in windows else None for k in range(max(windows) + 1)]


def midrank_percentiles(keys: Mapping[str, Hashable]) -> dict[str, float]:
    """Each prompt's percentile among all `keys` (prompt id -> an orderable measure):
    100 * (prompts below + half the prompts equal, itself included) / prompts. Ties share one
    value, every value lies strictly inside (0, 100), and the mean over all prompts is exactly
    50 (the pairs below and above cancel, the equal ones count half), so training the whole
    dataset once scores 50 whatever the ties."""
    counts = Counter(keys.values())
    total = len(keys)
    by_key: dict[Hashable, float] = {}
    below = 0
    for key in sorted(counts):
        by_key[key] = 100.0 * (below + counts[key] / 2) / total
        below += counts[key]
    return {prompt_id: by_key[key] for prompt_id, key in keys.items()}


def trained_composition(ledger: list[dict], percentiles: Mapping[str, Mapping[str, float]]) -> list[dict]:
    """Per optimizer step (the run's `trained.jsonl` entries, runtime/ledger.py): its prompt
    ids and, for each measure of `percentiles` (measure -> prompt id -> percentile), the
    trained groups' percentiles with their median and mean."""
    steps = []
    for entry in ledger:
        record: dict = {"step": entry["step"], "prompt_ids": entry["prompt_ids"]}
        for measure, by_prompt in percentiles.items():
            values = [_percentile_of(by_prompt, prompt_id, measure) for prompt_id in entry["prompt_ids"]]
            record[f"{measure}_percentiles"] = [round(v, 2) for v in values]
            record[f"{measure}_median"] = round(statistics.median(values), 2)
            record[f"{measure}_mean"] = round(statistics.fmean(values), 2)
        steps.append(record)
    return steps


def _percentile_of(by_prompt: Mapping[str, float], prompt_id: str, measure: str) -> float:
    if prompt_id not in by_prompt:
        raise ValueError(f"trained prompt {prompt_id!r} is not in the dataset the {measure} percentiles rank")
    return by_prompt[prompt_id]


def half_means(runs: list[list[dict]], measure: str) -> dict:
    """Mean `measure` percentile of the groups trained in the first half of each run's steps
    (step <= last step // 2) and in the second half, pooled over `runs` (`trained_composition`
    lists; every group weighs the same) and per run. The dataset's mean is 50."""
    halves = [_split_halves(run, measure) for run in runs]
    first, second = ([v for half in halves for v in half[i]] for i in (0, 1))
    return {"first_half_mean": _rounded_mean(first), "second_half_mean": _rounded_mean(second),
            "first_half_mean_per_seed": [_rounded_mean(h[0]) for h in halves],
            "second_half_mean_per_seed": [_rounded_mean(h[1]) for h in halves]}


def _split_halves(run: list[dict], measure: str) -> tuple[list[float], list[float]]:
    middle = max((s["step"] for s in run), default=0) // 2
    first = [v for s in run if s["step"] <= middle for v in s[f"{measure}_percentiles"]]
    second = [v for s in run if s["step"] > middle for v in s[f"{measure}_percentiles"]]
    return first, second


def _rounded_mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 2) if values else None
