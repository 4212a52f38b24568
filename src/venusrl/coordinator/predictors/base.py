"""The interface every length predictor implements."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from venusrl.coordinator.predictors.query import Example, PredictionQuery


@runtime_checkable
class LengthPredictor(Protocol):
    """Predicts the tokens a trajectory has left to generate.

    `predict` may take milliseconds (a model forward): callers on the rollout path go through
    `BackgroundPredictor`, which runs it off their thread. `observe` feeds examples of finished
    trajectories (online learning; each predictor decides when to refit).
    """

    name: ClassVar[str]

    def predict(self, query: PredictionQuery) -> float: ...

    def predict_many(self, queries: Sequence[PredictionQuery]) -> list[float]: ...

    def observe(self, examples: Sequence[Example]) -> None: ...

    def fit(self, examples: Sequence[Example]) -> None: ...

    def save(self, path: str | Path) -> None: ...


class PredictorError(ValueError):
    """A predictor file or directory that cannot be loaded, naming what is wrong."""
