"""group_history: running statistics of the prompt's finished trajectories and its group mates."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from venusrl.coordinator.predictors.base import PredictorError
from venusrl.coordinator.predictors.query import Example, PredictionQuery

FORMAT = "venusrl.group_history/1"


class GroupHistoryPredictor:
    """Remaining tokens = mean of (L - g) over the known lengths L > g, where g is what the
    trajectory has generated. Known lengths come from the same prompt (earlier finished
    trajectories and group mates already done); when none of those exceeds g, from every
    prompt; when nothing is known, the prior less g (at least one turn's worth).
    """

    name = "group_history"

    def __init__(self, prior_remaining_tokens: float = 2048.0, per_prompt: int = 64, global_size: int = 4096) -> None:
        self.prior_remaining_tokens = prior_remaining_tokens
        self.per_prompt = per_prompt
        self._by_prompt: dict[str, deque[int]] = {}
        self._global: deque[int] = deque(maxlen=global_size)
        self._seen: set[tuple[str, int]] = set()

    def predict(self, query: PredictionQuery) -> float:
        g = query.generated_tokens
        lengths = list(self._by_prompt.get(query.prompt_id, ()))
        lengths += [query.mates_done_mean_tokens] * query.mates_done
        for pool in (lengths, self._global):
            remaining = self._mean_excess(pool, g)
            if remaining is not None:
                return remaining
        per_turn = g / query.turns if query.turns else 0.0
        return max(self.prior_remaining_tokens - g, per_turn)

    def predict_many(self, queries: Sequence[PredictionQuery]) -> list[float]:
        return [self.predict(q) for q in queries]

    def observe(self, examples: Sequence[Example]) -> None:
        """Each distinct (prompt, total length) is recorded once, however many of its turn
        boundaries are among the examples."""
        for example in examples:
            q = example.query
            total = q.generated_tokens + example.remaining_tokens
            if (q.prompt_id, total) in self._seen:
                continue
            self._seen.add((q.prompt_id, total))
            history = self._by_prompt.setdefault(q.prompt_id, deque(maxlen=self.per_prompt))
            if len(history) == history.maxlen:
                self._seen.discard((q.prompt_id, history[0]))
            history.append(total)
            self._global.append(total)

    def fit(self, examples: Sequence[Example]) -> None:
        self.observe(examples)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT,
            "prior_remaining_tokens": self.prior_remaining_tokens,
            "per_prompt": self.per_prompt,
            "global_size": self._global.maxlen,
            "by_prompt": {k: list(v) for k, v in self._by_prompt.items()},
            "global": list(self._global),
        })

    @classmethod
    def load(cls, path: str | Path) -> GroupHistoryPredictor:
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise PredictorError(f"{path}: cannot read group_history predictor ({err})") from None
        return cls.from_json(text, str(path))

    @classmethod
    def from_json(cls, text: str, source: str) -> GroupHistoryPredictor:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise PredictorError(f"{source}: cannot read group_history predictor ({err})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PredictorError(f"{source}: not a group_history predictor (expected format {FORMAT!r})")
        try:
            out = cls(data["prior_remaining_tokens"], data["per_prompt"], data["global_size"])
            for prompt_id, lengths in data["by_prompt"].items():
                out._by_prompt[prompt_id] = deque(lengths, maxlen=out.per_prompt)
                out._seen.update((prompt_id, n) for n in lengths)
            out._global.extend(data["global"])
        except (KeyError, TypeError, AttributeError) as err:
            raise PredictorError(f"{source}: malformed group_history predictor ({err!r})") from None
        return out

    @staticmethod
    def _mean_excess(lengths: Sequence[float], generated: int) -> float | None:
        if not lengths:
            return None
        arr = np.asarray(lengths, dtype=np.float64)
        longer = arr[arr > generated]
        return float(np.mean(longer - generated)) if longer.size else None
