"""Runs a length predictor off the caller's thread: submit never blocks, results are polled.

This adapter is outside the pure core: the rollout worker submits a query at a turn
boundary (overlapping the tool call), polls finished predictions, and feeds each one to
`DataCoordinator.on_prediction` with its own `now`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from venusrl.coordinator.predictors.base import LengthPredictor
from venusrl.coordinator.predictors.query import Example, PredictionQuery

logger = logging.getLogger(__name__)
BACKGROUND_NICE = 19  # the serving thread's nice value (Linux; elsewhere it runs at the process's)


@dataclass(slots=True, frozen=True)
class Prediction:
    trajectory_id: int
    remaining_tokens: float
    at_generated_tokens: int  # the query's generated_tokens: pass to on_prediction
    latency_s: float  # submit to result, queueing included


class BackgroundPredictor:
    """One worker thread serves queries, newest query per trajectory wins: a trajectory that
    reached its next boundary before its previous query ran only gets the newer answer.
    Observations (finished trajectories) go through the same thread, so the predictor itself
    needs no locking for them."""

    def __init__(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor
        self.errors = 0
        self._using = threading.Lock()  # the serving thread's calls vs save() from outside
        self._cond = threading.Condition()
        self._pending: dict[int, tuple[PredictionQuery, float]] = {}
        self._observations: list[Sequence[Example]] = []
        self._results: list[Prediction] = []
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"predictor-{predictor.name}", daemon=True)
        self._thread.start()

    def submit(self, query: PredictionQuery) -> None:
        if query.trajectory_id < 0:
            raise ValueError("submit: query.trajectory_id must be set (>= 0)")
        with self._cond:
            if self._closed:
                raise RuntimeError("submit: predictor is closed")
            self._pending.pop(query.trajectory_id, None)  # re-insert at the back, newest wins
            self._pending[query.trajectory_id] = (query, time.perf_counter())
            self._cond.notify()

    def observe(self, examples: Sequence[Example]) -> None:
        with self._cond:
            self._observations.append(examples)
            self._cond.notify()

    def poll(self) -> list[Prediction]:
        with self._cond:
            results, self._results = self._results, []
        return results

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def close(self, timeout: float | None = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _serve(self) -> None:
        # Background work: on cores the engines share, a prediction's CPU is taken from the rollout
        # path, so this thread runs at the lowest CPU priority (its own nice value: Linux threads
        # have one each). Starved, it answers later, and a trajectory's superseded query is dropped
        # unanswered (newest wins): it does less work exactly when the cores are busiest.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        while True:
            with self._cond:
                while not (self._pending or self._observations or self._closed):
                    self._cond.wait()
                if self._closed:
                    return
                observations, self._observations = self._observations, []
                job = None
                if self._pending:
                    tid = next(iter(self._pending))
                    job = (tid, *self._pending.pop(tid))
            for examples in observations:
                self._run(lambda ex=examples: self.predictor.observe(ex), "observe")
            if job is not None:
                tid, query, submitted = job
                value = self._run(lambda q=query: self.predictor.predict(q), "predict")
                if value is not None:
                    prediction = Prediction(tid, max(0.0, float(value)), query.generated_tokens,
                                            time.perf_counter() - submitted)
                    with self._cond:
                        self._results.append(prediction)

    def save(self, path: str | Path) -> None:
        """Write the predictor's state between two of its calls (for checkpoints)."""
        with self._using:
            self.predictor.save(path)

    def _run(self, call, what: str):
        try:
            with self._using:
                return call()
        except Exception:
            self.errors += 1
            logger.exception("%s predictor %s failed (%d failures so far)", self.predictor.name, what, self.errors)
            return None
