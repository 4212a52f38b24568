"""Length predictors: remaining generation tokens of a trajectory at a turn boundary."""

from __future__ import annotations

from concurrent.futures import Executor

from venusrl.coordinator.config import PredictorConfig
from venusrl.coordinator.predictors.background import BackgroundPredictor, Prediction
from venusrl.coordinator.predictors.base import LengthPredictor, PredictorError
from venusrl.coordinator.predictors.group_history import GroupHistoryPredictor
from venusrl.coordinator.predictors.learned import LearnedPredictor
from venusrl.coordinator.predictors.query import (
    Example,
    PredictionQuery,
    examples_of_finished,
    query_from_messages,
    query_from_trajectory,
)

PREDICTORS = ("group_history", "learned", "lm")


def make_predictor(config: PredictorConfig, *, refit_executor: Executor | None = None) -> LengthPredictor:
    """The predictor `config.kind`, loaded from `config.path` when set."""
    if config.kind == "group_history":
        if config.path:
            return GroupHistoryPredictor.load(config.path)
        return GroupHistoryPredictor(config.prior_remaining_tokens, config.history_per_prompt, config.history_global)
    if config.kind == "learned":
        options = {
            "iterations": config.boosting_iterations, "max_rows": config.max_rows,
            "refit_every": config.refit_every, "min_rows": config.min_rows,
            "prior_remaining_tokens": config.prior_remaining_tokens, "executor": refit_executor,
        }
        if config.path:
            return LearnedPredictor.load(config.path, **options)
        return LearnedPredictor(buckets=config.hash_buckets, **options)
    from venusrl.coordinator.predictors.lm import LmPredictor

    model_dir = config.path or config.lm_model
    if not model_dir:
        raise PredictorError("predictor.kind 'lm' needs predictor.path (trained) or predictor.lm_model (base)")
    return LmPredictor(
        model_dir, device=config.lm_device, max_tokens=config.lm_max_tokens,
        learning_rate=config.lm_learning_rate, epochs=config.lm_epochs, batch_size=config.lm_batch_size,
    )


__all__ = [
    "PREDICTORS",
    "BackgroundPredictor",
    "Example",
    "GroupHistoryPredictor",
    "LearnedPredictor",
    "LengthPredictor",
    "Prediction",
    "PredictionQuery",
    "PredictorError",
    "examples_of_finished",
    "make_predictor",
    "query_from_messages",
    "query_from_trajectory",
]
