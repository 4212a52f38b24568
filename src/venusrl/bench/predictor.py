"""`venusrl bench predictor`: accuracy and latency of each length predictor.

On the synthetic multi-turn workload (venusrl.coordinator.predictors.synthetic), every
predictor is trained on one epoch of rollouts and evaluated on
- `seen_prompts`: a later epoch of rollouts of the same prompts (how an RL run uses it: the
  dataset repeats, the predictor learns from its earlier traces), the headline figures;
- `unseen_prompts`: rollouts of prompts it never saw.
With --data, the JSONL of (messages, remaining_tokens) rows is split by prompt instead.
"""

from __future__ import annotations

import logging
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import typer

from venusrl.bench.report import emit
from venusrl.coordinator.predictors import PREDICTORS, GroupHistoryPredictor, LearnedPredictor
from venusrl.coordinator.predictors.evaluate import accuracy, latency
from venusrl.coordinator.predictors.examples_io import read_examples
from venusrl.coordinator.predictors.query import Example
from venusrl.coordinator.predictors.synthetic import make_tasks, rollout

logger = logging.getLogger(__name__)
SPEARMAN_TARGET = 0.9  # issue target for `learned`; the paper reports 0.98 for a fine-tuned 0.6B LM


def synthetic_splits(quick: bool, group_size: int = 8) -> tuple[list[Example], dict[str, list[Example]], dict]:
    n_train, n_eval = (120, 40) if quick else (300, 100)
    tasks = make_tasks(n_train, seed=1, prefix="task")
    train = [e for t in rollout(tasks, group_size, seed=2) for e in t.examples()]
    seen = [e for t in rollout(tasks[:n_eval], group_size, seed=3) for e in t.examples()]
    unseen = [e for t in rollout(make_tasks(n_eval, seed=4, prefix="new"), group_size, seed=5) for e in t.examples()]
    workload = {"source": "synthetic", "train_prompts": n_train, "eval_prompts": n_eval, "group_size": group_size}
    return train, {"seen_prompts": seen, "unseen_prompts": unseen}, workload


def data_splits(path: Path) -> tuple[list[Example], dict[str, list[Example]], dict]:
    """80/20 split by prompt id, so no prompt is in both."""
    examples = read_examples(path)
    held_out = [e for e in examples if zlib.crc32(e.query.prompt_id.encode()) % 5 == 0]
    train = [e for e in examples if zlib.crc32(e.query.prompt_id.encode()) % 5 != 0]
    if not train or not held_out:
        raise typer.BadParameter(f"{path}: needs rows of several prompts to split 80/20 by prompt_id")
    return train, {"held_out_prompts": held_out}, {"source": str(path), "rows": len(examples)}


def build(kind: str, quick: bool, lm_model: Path | None, workdir: Path):
    if kind == "group_history":
        return GroupHistoryPredictor(), {}
    if kind == "learned":
        return LearnedPredictor(buckets=64, iterations=100 if quick else 200), {}
    from venusrl.coordinator.predictors.lm import LmPredictor

    note = {}
    if lm_model is None:
        from venusrl.model.tiny import make_tiny_model

        lm_model = make_tiny_model(workdir / "tiny", seed=1)
        note = {"note": "tiny random-init model (no --lm-model): plumbing and latency only"}
    return LmPredictor(lm_model, max_tokens=256, epochs=1, batch_size=8, learning_rate=1e-4), {
        "model": str(lm_model), **note,
    }


def evaluate_predictor(kind, train, splits, quick, lm_model, workdir) -> dict[str, Any]:
    predictor, info = build(kind, quick, lm_model, workdir)
    if kind == "lm":  # fine-tuning a transformer on a CPU: a bounded sample of the data
        step = max(1, len(train) // (128 if quick else 512))
        train = train[::step]
        splits = {name: examples[:: max(1, len(examples) // (100 if quick else 300))] for name, examples in splits.items()}
    start = time.perf_counter()
    predictor.fit(train)
    result: dict[str, Any] = {"train_examples": len(train), "fit_s": round(time.perf_counter() - start, 3), **info}
    for name, examples in splits.items():
        result[name] = accuracy(predictor.predict_many([e.query for e in examples]), examples)
    headline = next(iter(splits))
    result.update({k: result[headline][k] for k in ("spearman", "spearman_by_turn", "mae", "mape")})
    result.update(latency(predictor, splits[headline], samples=50 if quick else 300))
    logger.info("%s: spearman %.3f, p99 %.2f ms", kind, result["spearman"], result["latency_p99_ms"])
    return result


def run(quick: bool, data: Path | None, predictors: list[str], lm_model: Path | None) -> dict[str, Any]:
    train, splits, workload = data_splits(data) if data else synthetic_splits(quick)
    out: dict[str, Any] = {"benchmark": "predictor", "quick": quick, "workload": workload,
                           "headline_split": next(iter(splits)), "predictors": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in predictors:
            out["predictors"][kind] = evaluate_predictor(kind, train, splits, quick, lm_model, Path(tmp))
    if "learned" in out["predictors"]:
        rho = out["predictors"]["learned"]["spearman"]
        out["target"] = {"learned_spearman": SPEARMAN_TARGET, "met": rho >= SPEARMAN_TARGET}
    return out


def main(quick: bool, json_out: Path | None, data: Path | None, predictors: str, lm_model: Path | None) -> None:
    kinds = [k.strip() for k in predictors.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in PREDICTORS]
    if unknown or not kinds:
        raise typer.BadParameter(f"unknown predictors {unknown} (known: {', '.join(PREDICTORS)})", param_hint="--predictors")
    emit(run(quick, data, kinds, lm_model), json_out)
