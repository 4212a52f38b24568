"""Scenario results as rows, a markdown table and a bar plot."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

_VALUES = ("throughput", "speedup", "first_batch_speedup", "end_to_end_speedup")  # a row's other keys label its case
_PER_SEED = ("end_to_end_speedup", "hit_rate")  # also listed seed by seed (`<key>_per_seed`)
_RANGE = "end_to_end_speedup_range"  # with perturbations: each system's lowest and highest run
_NOT_LABELS = (*_VALUES, "seeds", "perturbations", _RANGE, *(f"{key}_per_seed" for key in _PER_SEED))


def rows(cases: list[dict[str, Any]], reference: str, invert: bool = False) -> list[dict[str, Any]]:
    """One row per case: each system's throughput (trained tokens/s) and its speedup over
    `reference` (with `invert`, the reference's speedup over it), and the same speedup in time
    to the first batch and in time to the last step. Throughput over the later steps hides
    what a faster first step gains, and charges it: on a saturated cluster, a first batch Δ
    sooner widens the later steps' window by Δ.

    A case run under several seeds (runs carry `seed`) gives the medians over seeds, each
    speedup paired within its seed: one seed's scheduling noise (about ±8% in time to the
    first batch, ±3% in throughput between predictor seeds) is larger than most policy effects.
    Runs of a seed under several perturbations (runs carry `perturbation`) are paired within
    it too; the seed's figures are their medians, and `end_to_end_speedup_range` gives each
    system's lowest and highest speedup over every seed and perturbation."""
    out = []
    for case in cases:
        by_seed: dict[int, dict[int, list[dict[str, Any]]]] = {}
        for run in case["runs"]:
            by_seed.setdefault(run.get("seed", 0), {}).setdefault(run.get("perturbation", 0), []).append(run)
        paired = [[_ratio_row(runs, reference, invert) for runs in by_perturbation.values()]
                  for by_perturbation in by_seed.values()]
        # a seed's figures: the medians of its perturbations, unrounded (one perturbation: its own)
        per_seed = [{key: _per_system((r[key] for r in rows_of_seed), statistics.median) for key in (*_VALUES, "hit_rate")}
                    for rows_of_seed in paired]
        row = {key: _median(r[key] for r in per_seed) for key in _VALUES}
        for key in _PER_SEED:
            row[f"{key}_per_seed"] = {name: [r[key].get(name) for r in per_seed] for name in per_seed[0][key]}
        perturbations = max(len(rows_of_seed) for rows_of_seed in paired)
        if perturbations > 1:
            row[_RANGE] = _range(r["end_to_end_speedup"] for rows_of_seed in paired for r in rows_of_seed)
        out.append({**case["label"], **({"seeds": len(per_seed)} if len(per_seed) > 1 else {}),
                    **({"perturbations": perturbations} if perturbations > 1 else {}), **row})
    return out


def _ratio_row(runs: list[dict[str, Any]], reference: str, invert: bool) -> dict[str, dict[str, float | None]]:
    throughput = {run["name"]: run["throughput_tokens_per_s"] for run in runs}
    # a rate: reciprocal of the time, so it divides like throughput
    first_batch = {run["name"]: 1 / run["time_to_first_batch_s"] if run.get("time_to_first_batch_s") else None
                   for run in runs}
    last_step = {run["name"]: 1 / run["step_times"][-1] if run.get("step_times") else None for run in runs}
    return {"throughput": throughput, "speedup": _ratios(throughput, reference, invert),
            "first_batch_speedup": _ratios(first_batch, reference, invert),
            "end_to_end_speedup": _ratios(last_step, reference, invert),
            "hit_rate": {run["name"]: run.get("engine", {}).get("hit_rate") for run in runs}}


def _per_system(values: Any, reduce: Callable[[list[float]], Any]) -> dict[str, Any]:
    """Per system, `reduce` of its values over runs (None where a run has none)."""
    values = list(values)
    known = {name: [v[name] for v in values if v.get(name) is not None] for name in values[0]}
    return {name: reduce(k) if len(k) == len(values) else None for name, k in known.items()}


def _median(values: Any) -> dict[str, float | None]:
    """Per system, the median of its values over seeds."""
    return _per_system(values, lambda known: round(statistics.median(known), 3))


def _range(values: Any) -> dict[str, list[float] | None]:
    """Per system, its lowest and highest value."""
    return _per_system(values, lambda known: [min(known), max(known)])


def _ratios(rates: dict[str, float | None], reference: str, invert: bool) -> dict[str, float | None]:
    base = rates.get(reference)
    return {name: (round(base / value, 3) if invert else round(value / base, 3)) if base and value else None
            for name, value in rates.items()}


def markdown(table: list[dict[str, Any]], reference: str, paper: dict[int, tuple[float, ...]] | None = None,
             invert: bool = False) -> str:
    if not table:
        return ""
    names = list(table[0]["throughput"])
    label_keys = [k for k in table[0] if k not in _NOT_LABELS]
    others = [n for n in names if n != reference]
    ratio = [f"{reference} / {n}" if invert else f"{n} / {reference}" for n in others]
    header = [*label_keys, *(f"{n} tok/s" for n in names), *ratio, *(f"{r} (first batch)" for r in ratio),
              *(f"{r} (to the last step)" for r in ratio), f"prefix hit rate {' / '.join(names)} (per seed)"]
    if paper:
        header.append("paper (Table 1)")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    if "perturbations" in table[0]:  # the medians of ratios need not be the ratios of the median rates
        lines.insert(0, f"Medians over {table[0].get('seeds', 1)} seeds x {table[0]['perturbations']} perturbations "
                        "(outputs delivered up to a millisecond later); each speedup is the median of its per-seed "
                        "medians, paired within each seed and perturbation, with its lowest and highest run to the "
                        "last step in brackets.\n")
    elif "seeds" in table[0]:
        lines.insert(0, f"Medians over {table[0]['seeds']} seeds; each speedup is the median of its per-seed ratios.\n")
    for row in table:
        cells = [str(row[k]) for k in label_keys]
        cells += [f"{row['throughput'][n]:,.0f}" for n in names]
        for values in ("speedup", "first_batch_speedup"):
            cells += [f"{row[values][n]:.2f}x" if row[values][n] is not None else "-" for n in others]
        cells += [_with_range(row["end_to_end_speedup"][n], row.get(_RANGE, {}).get(n)) for n in others]
        cells.append(" / ".join(",".join(f"{v:.2f}" if v is not None else "-" for v in row["hit_rate_per_seed"][n])
                                for n in names))
        if paper:
            cells.append(" / ".join(f"{v:.2f}" for v in paper.get(row.get("batch"), ())))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _with_range(value: float | None, bounds: list[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" + (f" ({bounds[0]:.2f}-{bounds[1]:.2f})" if bounds else "")


def plot(table: list[dict[str, Any]], reference: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table[0]["throughput"])
    labels = [", ".join(f"{v}" for k, v in row.items() if k not in _NOT_LABELS) for row in table]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(table)), 4))
    for i, name in enumerate(names):
        values = [row["speedup"][name] or 0.0 for row in table]
        ax.bar([x + i * width for x in range(len(table))], values, width, label=name)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(table))], labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"throughput / {reference}")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
