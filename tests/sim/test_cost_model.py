from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.engine.step_log import StepSample
from venusrl.sim.cost_model import QWEN3_4B, QWEN3_32B, GpuSpec, fit, preset
from venusrl.sim.predictor import NoisyLengthPredictor, log_spread


def test_fit_recovers_the_coefficients_of_noiseless_steps():
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(40):
        p, d, kv = int(rng.integers(0, 500)), int(rng.integers(0, 32)), int(rng.integers(0, 20000))
        samples.append(StepSample(p, d, kv, 0.003 + 2e-5 * (p + d) + 1e-7 * kv))
    model = fit(samples, kv_capacity_tokens=1000)
    assert model.fixed_s == pytest.approx(0.003, rel=1e-6)
    assert model.token_s == pytest.approx(2e-5, rel=1e-6)
    assert model.kv_token_s == pytest.approx(1e-7, rel=1e-6)


def test_fit_keeps_coefficients_non_negative():
    samples = [StepSample(p, 1, 10 * p, 0.01) for p in range(10)]
    model = fit(samples, kv_capacity_tokens=10)
    assert min(model.fixed_s, model.token_s, model.kv_token_s) >= 0


def test_presets_follow_the_hardware():
    small, big = preset("qwen3-4b", 1), preset("qwen3-32b", 2)
    assert QWEN3_32B.kv_bytes_per_token > QWEN3_4B.kv_bytes_per_token
    assert big.kv_capacity_tokens < small.kv_capacity_tokens
    assert big.fixed_s > small.fixed_s and big.token_s > small.token_s
    assert small.reload_token_s < small.token_s  # reloading beats recomputing
    with pytest.raises(ValueError):  # 65 GB of weights do not fit on a 40 GB GPU
        preset("qwen3-32b", 1, GpuSpec("A100-40GB", hbm_bytes=40e9, hbm_bytes_per_s=1.5e12, flops=312e12))


def test_an_iteration_with_decode_stands_for_quantum_steps():
    model = preset("qwen3-4b", 1)
    one = model.iteration_seconds(1, 0, [100], 0)
    sixteen = model.iteration_seconds(16, 0, [100 // 16], 0)
    assert sixteen > 10 * one
    assert model.iteration_seconds(16, 10, [], 10) < model.iteration_seconds(16, 10, [], 0)


def test_the_predictor_has_the_rank_correlation_asked_for():
    rng = np.random.default_rng(1)
    truth = np.exp(rng.normal(8, 1, 4000)).astype(int)
    predictor = NoisyLengthPredictor(0.8, log_spread(list(truth)), seed=2)
    predicted = np.array([predictor.predict(t) for t in truth])
    ranks = lambda x: np.argsort(np.argsort(x))  # noqa: E731
    rho = np.corrcoef(ranks(truth), ranks(predicted))[0, 1]
    assert abs(rho - 0.8) < 0.05
    exact = NoisyLengthPredictor(1.0, 1.0)
    assert exact.predict(1234) == pytest.approx(1234)


@settings(max_examples=50, deadline=None)
@given(truth=st.floats(0, 1e6), spearman=st.floats(0.05, 1.0), spread=st.floats(0.1, 3.0), seed=st.integers(0, 99))
def test_predictions_are_never_negative(truth, spearman, spread, seed):
    """The coordinator rejects a negative remaining length; noise on a short one must not make it."""
    predictor = NoisyLengthPredictor(spearman, spread, seed=seed)
    assert all(predictor.predict(truth) >= 0 for _ in range(20))
