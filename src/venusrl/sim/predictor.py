"""A length predictor with a chosen rank correlation to the truth.

The prediction is the true remaining length times log-normal noise (a Gaussian copula): on
the log scale, corr(log truth, log prediction) = r, and for a bivariate normal Spearman's
rho = (6/pi) asin(r/2), so r = 2 sin(pi rho / 6). `log_spread` is the standard deviation of
log remaining lengths across trajectories (measured on the workload), which sets how much
noise a given correlation allows.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class NoisyLengthPredictor:
    spearman: float
    log_spread: float
    latency_s: float = 0.05
    seed: int = 0
    _rng: random.Random = field(init=False)
    _noise_sigma: float = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.spearman <= 1:
            raise ValueError(f"spearman must be in (0, 1], got {self.spearman}")
        pearson = 2 * math.sin(math.pi * self.spearman / 6)
        self._noise_sigma = self.log_spread * math.sqrt(max(0.0, 1 / pearson**2 - 1))
        self._rng = random.Random(self.seed)

    def predict(self, true_remaining: float) -> float:
        """>= 0: noise on log(1 + length) can take a short remainder below zero."""
        noise = self._rng.gauss(0.0, self._noise_sigma) if self._noise_sigma else 0.0
        return max(0.0, math.expm1(math.log1p(max(0.0, true_remaining)) + noise))


def log_spread(lengths: list[int]) -> float:
    """Standard deviation of log(1 + length)."""
    logs = [math.log1p(n) for n in lengths]
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((x - mean) ** 2 for x in logs) / max(1, len(logs) - 1))
