"""Feature vector of a query for the learned predictor.

Hashed word uni- and bi-grams of the prompt and of the last observation (crc32, so the same
text gives the same features in every process), the first numbers of the last observation
(tool outputs often count things: failing tests, errors, lines), the first numbers of
the prompt (files to change, constraints), and the trajectory's
progress: turns, tokens, tool errors, group-mate progress.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence

import numpy as np

from venusrl.coordinator.predictors.query import PredictionQuery

_WORD = re.compile(r"[A-Za-z_]+|\d+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
OBSERVATION_NUMBERS = 3
PROMPT_NUMBERS = 2
NUMERIC_FEATURES = (
    *(f"prompt_number_{i}" for i in range(PROMPT_NUMBERS)),
    "turns", "generated_tokens", "log_generated_tokens", "tool_errors",
    "mates_done_fraction", "mates_done_mean_tokens", "mates_mean_generated",
    "mates_done_mean_minus_generated", "prompt_words", "observation_words",
    *(f"observation_number_{i}" for i in range(OBSERVATION_NUMBERS)),
    "observation_number_ratio_1_0", "observation_number_ratio_0_1",
)


def feature_count(buckets: int) -> int:
    return len(NUMERIC_FEATURES) + 2 * buckets


def featurize(queries: Sequence[PredictionQuery], buckets: int) -> np.ndarray:
    out = np.zeros((len(queries), feature_count(buckets)), dtype=np.float32)
    for row, q in enumerate(queries):
        prompt_words = _WORD.findall(q.prompt_text.lower())
        observation_words = _WORD.findall(q.last_observation.lower())
        numbers = _first_numbers(q.last_observation, OBSERVATION_NUMBERS)
        ratio_1_0 = numbers[1] / numbers[0] if numbers[0] > 0 and numbers[1] >= 0 else -1.0
        ratio_0_1 = numbers[0] / numbers[1] if numbers[1] > 0 and numbers[0] >= 0 else -1.0
        done_fraction = q.mates_done / q.mates_total if q.mates_total else 0.0
        out[row, : len(NUMERIC_FEATURES)] = (
            *_first_numbers(q.prompt_text, PROMPT_NUMBERS), q.turns, q.generated_tokens, math.log1p(q.generated_tokens), q.tool_errors,
            done_fraction, q.mates_done_mean_tokens, q.mates_mean_generated,
            q.mates_done_mean_tokens - q.generated_tokens if q.mates_done else 0.0,
            len(prompt_words), len(observation_words), *numbers, ratio_1_0, ratio_0_1,
        )
        base = len(NUMERIC_FEATURES)
        _hash_ngrams(prompt_words, out[row, base : base + buckets])
        _hash_ngrams(observation_words, out[row, base + buckets :])
    return out


def _first_numbers(text: str, count: int) -> list[float]:
    """The first `count` numbers in the text, -1 for each one missing."""
    numbers = [float(n) for n in _NUMBER.findall(text)[:count]]
    return numbers + [-1.0] * (count - len(numbers))


def _hash_ngrams(words: list[str], into: np.ndarray) -> None:
    buckets = into.shape[0]
    grams = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
    for gram in grams:
        into[zlib.crc32(gram.encode()) % buckets] += 1.0
    np.log1p(into, out=into)
