"""A length predictor with a chosen rank correlation to the truth.

The prediction is the true remaining length times log-normal noise (a Gaussian copula): on
the log scale, corr(log truth, log prediction) = r, and for a bivariate normal Spearman's
rho = (6/pi) asin(r/2), so r = 2 sin(pi rho / 6). `log_spread` is the standard deviation of
log remaining lengths across trajectories (measured on the workload), which sets how much
noise a given correlation allows.

A real predictor's errors are not fresh at every query: it misjudges a trajectory from its
prompt and its history, and both persist from one turn boundary to the next. The noise is a
per-trajectory component, drawn once per trajectory, plus a per-query one; `trajectory_share`
is the share of the noise's variance that is the trajectory's, so it is the correlation of
the log errors of two queries of one trajectory (0: fresh at every query, the earlier model).
The total variance, hence the correlation with the truth over all queries, does not depend
on it. The trajectory's component is a function of (seed, trajectory) alone, so every system
simulated with one seed sees the same misjudged trajectories.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass(slots=True)
class NoisyLengthPredictor:
    spearman: float
    log_spread: float
    latency_s: float = 0.05
    seed: int = 0
    trajectory_share: float = 0.0
    _rng: random.Random = field(init=False)
    _noise_sigma: float = field(init=False)

    def __post_init__(self) -> None:
        if not 0 < self.spearman <= 1:
            raise ValueError(f"spearman must be in (0, 1], got {self.spearman}")
        if not 0 <= self.trajectory_share <= 1:
            raise ValueError(f"trajectory_share must be in [0, 1], got {self.trajectory_share}")
        pearson = 2 * math.sin(math.pi * self.spearman / 6)
        self._noise_sigma = self.log_spread * math.sqrt(max(0.0, 1 / pearson**2 - 1))
        self._rng = random.Random(self.seed)

    def predict(self, true_remaining: float, trajectory: Hashable | None = None) -> float:
        """>= 0: noise on log(1 + length) can take a short remainder below zero. Without a
        `trajectory` the whole noise is fresh."""
        return max(0.0, math.expm1(math.log1p(max(0.0, true_remaining)) + self.noise(trajectory)))

    def noise(self, trajectory: Hashable | None = None) -> float:
        """The log-scale error of one query of `trajectory`: sigma * (sqrt(s) z_trajectory +
        sqrt(1 - s) z_query), s = `trajectory_share`."""
        if not self._noise_sigma:
            return 0.0
        share = self.trajectory_share if trajectory is not None else 0.0
        fresh = self._rng.gauss(0.0, self._noise_sigma * math.sqrt(1 - share)) if share < 1 else 0.0
        if not share:
            return fresh
        return fresh + self.trajectory_noise(trajectory) * math.sqrt(share)

    def trajectory_noise(self, trajectory: Hashable) -> float:
        """The trajectory's component at the full sigma, the same at every query of it."""
        return random.Random(f"{self.seed}/{trajectory!r}").gauss(0.0, self._noise_sigma)


def log_spread(lengths: list[int]) -> float:
    """Standard deviation of log(1 + length)."""
    logs = [math.log1p(n) for n in lengths]
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((x - mean) ** 2 for x in logs) / max(1, len(logs) - 1))
