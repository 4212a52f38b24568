"""learned: a gradient-boosted regressor on hashed text and progress features, trained online
from finished trajectories and refit in the background."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file
from sklearn.ensemble import HistGradientBoostingRegressor
from threadpoolctl import ThreadpoolController

from venusrl.coordinator.predictors.base import PredictorError
from venusrl.coordinator.predictors.features import featurize
from venusrl.coordinator.predictors.forest import FlatForest
from venusrl.coordinator.predictors.group_history import GroupHistoryPredictor
from venusrl.coordinator.predictors.query import Example, PredictionQuery

logger = logging.getLogger(__name__)
FORMAT = "venusrl.learned/2"  # safetensors: the forest's arrays, group_history as JSON metadata


class LearnedPredictor:
    """Regresses log(1 + remaining tokens). Until the first fit, group_history answers.

    group_history's own estimate is one of the features (the prompt's running statistics).
    A row is featurized before its trajectory enters that history, as at prediction time,
    so the feature never contains the answer.

    Rows (feature vector, target) accumulate in a bounded buffer, newest kept. After
    `refit_every` new rows a refit runs on `executor` (in the caller's thread when None);
    predictions keep using the previous model until the new one is swapped in whole.
    Predictions walk the fitted trees as a `FlatForest`: one query is a turn boundary, and
    sklearn's tree-by-tree predict costs several times more CPU per query on the engines' cores.
    """

    name = "learned"

    def __init__(
        self,
        *,
        buckets: int = 128,
        iterations: int = 200,
        max_rows: int = 50000,
        refit_every: int = 512,
        min_rows: int = 64,
        prior_remaining_tokens: float = 2048.0,
        executor: Executor | None = None,
        seed: int = 0,
    ) -> None:
        self.buckets = buckets
        self.iterations = iterations
        self.refit_every = refit_every
        self.min_rows = min_rows
        self.seed = seed
        self.fallback = GroupHistoryPredictor(prior_remaining_tokens)
        self._executor = executor
        self._lock = threading.Lock()
        self._threads = ThreadpoolController()
        self._features: deque[np.ndarray] = deque(maxlen=max_rows)
        self._targets: deque[float] = deque(maxlen=max_rows)
        self._rows_since_fit = 0
        self._refitting = False
        self._forest: FlatForest | None = None  # the fitted trees: what predicts and what `save` writes
        self.fits = 0

    @property
    def trained(self) -> bool:
        return self._forest is not None

    def predict(self, query: PredictionQuery) -> float:
        return self.predict_many([query])[0]

    def predict_many(self, queries: Sequence[PredictionQuery]) -> list[float]:
        forest = self._forest
        if forest is None:
            return self.fallback.predict_many(queries)
        log_remaining = forest.predict(self._featurize(queries))
        return np.maximum(np.expm1(log_remaining), 0.0).tolist()

    def observe(self, examples: Sequence[Example]) -> None:
        """Learn from the examples of finished trajectories (refit when due)."""
        if not examples:
            return
        self._add_rows(examples)
        with self._lock:
            due = (
                not self._refitting
                and len(self._targets) >= self.min_rows
                and (self._forest is None or self._rows_since_fit >= self.refit_every)
            )
            if due:
                self._refitting = True
        if due:
            if self._executor is None:
                self._refit()
            else:
                self._executor.submit(self._refit)

    def fit(self, examples: Sequence[Example]) -> None:
        """Add the examples and fit now, in this thread."""
        with self._lock:
            self._refitting = True  # no background refit while this one is added and fitted
        self._add_rows(examples)
        self._refit()

    def _add_rows(self, examples: Sequence[Example]) -> None:
        """Featurize each trajectory's rows, then let group_history learn its length."""
        by_trajectory: dict[tuple[str, int], list[Example]] = {}
        for e in examples:
            key = (e.query.prompt_id, e.query.generated_tokens + e.remaining_tokens)
            by_trajectory.setdefault(key, []).append(e)
        for rows in by_trajectory.values():
            features = self._featurize([e.query for e in rows])
            self.fallback.observe(rows)
            with self._lock:
                self._features.extend(features)
                self._targets.extend(np.log1p([e.remaining_tokens for e in rows]))
                self._rows_since_fit += len(rows)

    def _featurize(self, queries: Sequence[PredictionQuery]) -> np.ndarray:
        history = np.log1p(np.asarray(self.fallback.predict_many(queries), dtype=np.float32))
        return np.hstack([featurize(queries, self.buckets), history[:, None]])

    def _refit(self) -> None:
        try:
            with self._lock:
                x = np.stack(self._features) if self._features else None
                y = np.asarray(self._targets, dtype=np.float64)
                self._rows_since_fit = 0
            if x is None or len(y) < 2:
                return
            model = HistGradientBoostingRegressor(
                max_iter=self.iterations, learning_rate=0.1, max_leaf_nodes=31,
                early_stopping=False, random_state=self.seed,
            )
            # One thread: a background refit must not take the cores of the rollout path.
            with self._threads.limit(limits=1):
                model.fit(x, y)
            self._forest = FlatForest(model)  # one reference swap: readers see the old or the new trees
            self.fits += 1
            logger.info("learned predictor refit %d on %d rows", self.fits, len(y))
        except Exception:
            logger.exception("learned predictor refit failed; keeping the previous model")
        finally:
            with self._lock:
                self._refitting = False

    def save(self, path: str | Path) -> None:
        """One safetensors file: the trees as plain arrays; group_history and the hashing
        buckets in its metadata. No pickle, so loading a file cannot run code."""
        forest = self._forest
        if forest is None:
            raise PredictorError("learned predictor has no model yet: fit it before saving")
        save_file(forest.arrays(), str(path), metadata={
            "format": FORMAT, "buckets": str(self.buckets), "fallback": self.fallback.to_json()})

    @classmethod
    def load(cls, path: str | Path, **kwargs) -> LearnedPredictor:
        """Load a model written by `save`."""
        try:
            with safe_open(str(path), framework="numpy") as f:
                metadata = f.metadata() or {}
            arrays = load_file(str(path))
        except (OSError, SafetensorError) as err:
            raise PredictorError(f"{path}: cannot read learned predictor ({err})") from None
        if metadata.get("format") != FORMAT:
            raise PredictorError(f"{path}: not a learned predictor (expected format {FORMAT!r})")
        try:
            out = cls(buckets=int(metadata["buckets"]), **kwargs)
            out._forest = FlatForest.from_arrays(arrays)
        except (KeyError, ValueError) as err:
            raise PredictorError(f"{path}: malformed learned predictor ({err})") from None
        out.fallback = GroupHistoryPredictor.from_json(metadata.get("fallback", ""), f"{path} (group_history)")
        return out
