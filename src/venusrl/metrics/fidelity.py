"""Training fidelity of a run, as the paper's Fig. 11 and Fig. 12 show it: reward per step,
and the weight versions trajectories span by trajectory-length percentile, with the share
of the longest trajectories discarded as stale.

Every trajectory attempt counts once: trained ones with the span their turns cover (the
group records' `version_spans` and `trajectory_tokens`), and attempts discarded for
staleness (`stale_discard_tokens` of the summary) in the last row, "discarded", since they
would have spanned more versions than the bound allows. Percentiles are over the lengths
(generated tokens) of all attempts of the run, a discarded one at the length it had reached."""

from __future__ import annotations

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
