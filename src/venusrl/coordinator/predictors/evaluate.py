"""Accuracy and latency of a predictor on examples: what `bench predictor` and
`venusrl predictor eval` report."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from scipy.stats import spearmanr

from venusrl.coordinator.predictors.base import LengthPredictor
from venusrl.coordinator.predictors.query import Example

MIN_PER_TURN = 20  # turn indices with fewer examples are left out of spearman_by_turn


def accuracy(predicted: Sequence[float], examples: Sequence[Example]) -> dict[str, float | int]:
    """spearman: rank correlation of predicted and true remaining tokens over every turn
    boundary; spearman_by_turn: its mean within each turn index (ordering among trajectories
    at the same stage); mae in tokens; mape relative to max(true, 1)."""
    pred = np.asarray(predicted, dtype=np.float64)
    true = np.asarray([e.remaining_tokens for e in examples], dtype=np.float64)
    turns = np.asarray([e.query.turns for e in examples])
    by_turn = defaultdict(list)
    for turn in np.unique(turns):
        mask = turns == turn
        if mask.sum() >= MIN_PER_TURN and np.ptp(true[mask]) > 0 and np.ptp(pred[mask]) > 0:
            by_turn["rho"].append(spearmanr(pred[mask], true[mask]).statistic)
    constant = np.ptp(pred) == 0 or np.ptp(true) == 0
    return {
        "examples": len(examples),
        "spearman": 0.0 if constant else float(spearmanr(pred, true).statistic),
        "spearman_by_turn": float(np.mean(by_turn["rho"])) if by_turn["rho"] else 0.0,
        "mae": float(np.mean(np.abs(pred - true))),
        "mape": float(np.mean(np.abs(pred - true) / np.maximum(true, 1.0))),
    }


def latency(predictor: LengthPredictor, examples: Sequence[Example], samples: int) -> dict[str, float]:
    """Milliseconds of one `predict` call (one query, as at a turn boundary)."""
    picked = examples[:: max(1, len(examples) // samples)][:samples]
    times = []
    for e in picked:
        start = time.perf_counter()
        predictor.predict(e.query)
        times.append((time.perf_counter() - start) * 1e3)
    return {
        "latency_p50_ms": float(np.percentile(times, 50)),
        "latency_p99_ms": float(np.percentile(times, 99)),
        "latency_samples": len(times),
    }
