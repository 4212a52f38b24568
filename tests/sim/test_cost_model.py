from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.engine.step_log import StepSample
from venusrl.sim.cost_model import (
    EXTRA_TERMS,
    H100,
    ITERATION_TERMS,
    QWEN3_4B,
    QWEN3_32B,
    CostModel,
    GpuSpec,
    attention_pairs,
    fit,
    preset,
    without_terms,
)
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
    assert model.iteration_seconds(16, 0, [], 10, loads=1) < model.iteration_seconds(16, 10, [], 0)


def test_prefill_attention_is_the_causal_pairs_at_four_flops_a_layer_head_and_dim():
    """By hand: a chunk of 3 tokens at positions 5, 6, 7 attends to 6 + 7 + 8 = 21 keys."""
    assert attention_pairs(5, 3) == 21
    assert attention_pairs(0, 4) == 1 + 2 + 3 + 4
    cost = preset("qwen3-32b", 2)
    flops = 2 * H100.flops * H100.flops_efficiency
    assert cost.attention_pair_s == pytest.approx(4 * 64 * 64 * 128 / flops)
    # One token at a 64K context: its attention is 2.1x its dense matmuls (the claim).
    assert cost.attention_pair_s * 65536 / cost.token_s == pytest.approx(4 * 64 * 64 * 128 * 65536 / (2 * 32.8e9))
    assert 2.0 < cost.attention_pair_s * 65536 / cost.token_s < 2.2


def test_each_extra_term_adds_its_hand_computed_seconds():
    """A 2-unit chunk at unit 3 (quantum 4: 8 tokens at positions 12..19) and one load of 5
    units: pairs 8 * 12 + 8 * 9 / 2 = 132, prefix 12 tokens read, 20 tokens loaded."""
    cost = CostModel(fixed_s=1.0, token_s=0.1, kv_token_s=0.0, reload_token_s=0.01, kv_capacity_tokens=100,
                     attention_pair_s=1e-3, prefix_read_token_s=1e-2, reload_latency_s=0.5)
    seconds = cost.iteration_seconds(4, 2, [], 5, chunks=[(3, 2)], loads=1)
    assert seconds == pytest.approx(1.0 + 0.1 * 8 + 1e-3 * 132 + 1e-2 * 12 + 0.01 * 20 + 0.5)
    linear = without_terms(cost, list(EXTRA_TERMS))
    assert linear.iteration_seconds(4, 2, [], 5, chunks=[(3, 2)], loads=1) == pytest.approx(1.0 + 0.8 + 0.2)
    with pytest.raises(ValueError, match="unknown cost terms"):
        without_terms(cost, ["quadratic"])


@settings(max_examples=100, deadline=None)
@given(quantum=st.integers(1, 64), prefill=st.integers(0, 500), contexts=st.lists(st.integers(0, 4000), max_size=8),
       reload=st.integers(0, 300), loads=st.integers(0, 4), chunk=st.tuples(st.integers(0, 4000), st.integers(1, 500)),
       model=st.sampled_from([("qwen3-4b", 1), ("qwen3-32b", 2)]))
def test_an_iterations_terms_are_non_negative_and_sum_to_its_seconds(quantum, prefill, contexts, reload, loads, chunk,
                                                                     model):
    """The simulator reports busy time by term (`EngineTotals.term_s`) and prices iterations
    by their sum: the two must be one figure, to the last bit, whatever the batch."""
    cost = preset(*model)
    chunks = [chunk] if prefill else []
    terms = cost.iteration_terms(quantum, prefill, contexts, reload, chunks, loads)
    assert len(terms) == len(ITERATION_TERMS)
    assert all(term >= 0 for term in terms)
    assert sum(terms) == cost.iteration_seconds(quantum, prefill, contexts, reload, chunks, loads)
    named = dict(zip(ITERATION_TERMS, terms, strict=True))
    assert named["fixed"] == (quantum if contexts else 1) * cost.fixed_s
    assert (named["kv_read"] > 0) == bool(contexts)
    assert (named["reload_latency"] > 0) == bool(loads)


@settings(max_examples=100, deadline=None)
@given(start=st.integers(0, 2000), length=st.integers(2, 500), split=st.integers(1, 499))
def test_chunking_keeps_the_pairs_and_adds_prefix_reads(start, length, split):
    """Splitting a prefill in two computes the same attention pairs; only a step's fixed
    cost and the second chunk's prefix read are added."""
    split = min(split, length - 1)
    whole = attention_pairs(start, length)
    assert attention_pairs(start, split) + attention_pairs(start + split, length - split) == whole
    cost = preset("qwen3-4b", 1)
    one = cost.iteration_seconds(1, length, [], 0, chunks=[(start, length)])
    two = cost.iteration_seconds(1, split, [], 0, chunks=[(start, split)]) + cost.iteration_seconds(
        1, length - split, [], 0, chunks=[(start + split, length - split)])
    extra = two - one
    assert extra == pytest.approx(cost.fixed_s + cost.prefix_read_token_s * (start + split))


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


def test_a_trajectorys_errors_are_correlated_as_its_share_says_and_the_correlation_with_truth_is_kept():
    """Log errors: corr = share between two queries of one trajectory, 0 between trajectories,
    the same total variance (so the same rank correlation over all queries) at any share."""
    rng = np.random.default_rng(3)
    truth = np.exp(rng.normal(6, 1, (3000, 4))).astype(int)  # 3,000 trajectories, 4 queries each
    spread = log_spread(list(truth.ravel()))
    ranks = lambda x: np.argsort(np.argsort(x))  # noqa: E731
    sigma = spread * np.sqrt(1 / (2 * np.sin(np.pi * 0.7 / 6)) ** 2 - 1)  # the module's formula, by hand
    for share in (0.0, 0.6, 0.9):
        predictor = NoisyLengthPredictor(0.7, spread, seed=5, trajectory_share=share)
        errors = np.array([[predictor.noise(tid) for _ in range(4)] for tid in range(3000)])
        within = np.corrcoef(errors[:, 0], errors[:, 1])[0, 1]
        across = np.corrcoef(errors[:-1, 0], errors[1:, 1])[0, 1]  # query 0 of one, query 1 of the next
        assert abs(within - share) < 0.05
        assert abs(across) < 0.05
        assert errors.std() == pytest.approx(sigma, rel=0.05)
        predicted = np.array([[predictor.predict(t, tid) for t in row] for tid, row in enumerate(truth)])
        rho = np.corrcoef(ranks(truth.ravel()), ranks(predicted.ravel()))[0, 1]
        assert abs(rho - 0.7) < 0.05


@settings(max_examples=50, deadline=None)
@given(share=st.floats(0.0, 1.0), seed=st.integers(0, 99), trajectory=st.integers(0, 10**6),
       truth=st.floats(0, 1e6))
def test_a_trajectorys_own_error_is_a_function_of_the_seed_and_the_trajectory_alone(share, seed, trajectory, truth):
    """Every system simulated with one seed misjudges the same trajectories the same way,
    whatever else was asked before; a share of 1 gives one prediction per remaining length."""
    first = NoisyLengthPredictor(0.6, 1.0, seed=seed, trajectory_share=share)
    second = NoisyLengthPredictor(0.6, 1.0, seed=seed, trajectory_share=share)
    second.predict(123.0, trajectory + 1)  # another trajectory asked first
    assert first.trajectory_noise(trajectory) == second.trajectory_noise(trajectory)
    assert first.predict(truth, trajectory) >= 0
    if share == 1.0:
        assert first.predict(truth, trajectory) == first.predict(truth, trajectory)


def test_no_trajectory_share_is_the_fresh_noise_of_every_query():
    """Share 0 draws what the predictor drew before the share existed: the same stream."""
    fresh = NoisyLengthPredictor(0.8, 1.5, seed=4)
    shared = NoisyLengthPredictor(0.8, 1.5, seed=4, trajectory_share=0.0)
    assert [fresh.predict(500.0) for _ in range(10)] == [shared.predict(500.0, tid) for tid in range(10)]
    with pytest.raises(ValueError, match="trajectory_share"):
        NoisyLengthPredictor(0.8, 1.5, trajectory_share=1.5)


@settings(max_examples=50, deadline=None)
@given(truth=st.floats(0, 1e6), spearman=st.floats(0.05, 1.0), spread=st.floats(0.1, 3.0), seed=st.integers(0, 99))
def test_predictions_are_never_negative(truth, spearman, spread, seed):
    """The coordinator rejects a negative remaining length; noise on a short one must not make it."""
    predictor = NoisyLengthPredictor(spearman, spread, seed=seed)
    assert all(predictor.predict(truth) >= 0 for _ in range(20))
