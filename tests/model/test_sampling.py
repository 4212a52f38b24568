import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.model.sampling import SamplingRows, sample, sample_rows
from venusrl.types import SamplingParams


def logits():
    return torch.randn(50, generator=torch.Generator().manual_seed(0))


def test_greedy_is_argmax_with_its_logprob():
    x = logits()
    token, logprob = sample(x, SamplingParams(temperature=0), None)
    assert token == int(x.argmax())
    assert logprob == pytest.approx(float(torch.log_softmax(x, -1)[token]))


def test_top_k_one_is_greedy_whatever_the_seed():
    x = logits()
    for seed in range(10):
        token, _ = sample(x, SamplingParams(temperature=1.0, top_k=1), torch.Generator().manual_seed(seed))
        assert token == int(x.argmax())


def test_tiny_top_p_is_greedy():
    x = logits()
    token, _ = sample(x, SamplingParams(temperature=1.0, top_p=1e-6), torch.Generator().manual_seed(3))
    assert token == int(x.argmax())


def test_logprob_is_under_the_temperature_scaled_distribution():
    x = logits()
    token, logprob = sample(x, SamplingParams(temperature=0.5), torch.Generator().manual_seed(1))
    assert logprob == pytest.approx(float(torch.log_softmax(x / 0.5, -1)[token]))


def test_same_seed_same_tokens_and_top_k_support():
    x = logits()
    allowed = set(torch.topk(x, 5).indices.tolist())
    draws = [sample(x, SamplingParams(top_k=5), torch.Generator().manual_seed(s))[0] for s in range(40)]
    again = [sample(x, SamplingParams(top_k=5), torch.Generator().manual_seed(s))[0] for s in range(40)]
    assert draws == again
    assert set(draws) <= allowed and len(set(draws)) > 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -1}, "temperature"),
     ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k")],
)
def test_bad_params_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def _rows(params, seeds):
    return SamplingRows.build(params, seeds, torch.device("cpu"), torch.Generator().manual_seed(0))


def test_draws_follow_the_temperature_scaled_distribution():
    """Gumbel-max over the seed hash: over many seeds each token's frequency is its probability."""
    x = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    params = [SamplingParams(temperature=0.7)] * 8000
    tokens = sample_rows(x.expand(8000, -1), _rows(params, list(range(8000))))[:, 0].long()
    frequencies = torch.bincount(tokens, minlength=5).float() / 8000
    assert torch.allclose(frequencies, torch.softmax(x / 0.7, -1), atol=0.02)


@settings(max_examples=30)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.7]), st.sampled_from([0, 1, 3]),
                          st.sampled_from([1.0, 0.9, 0.3]), st.integers(0, 2**64 - 1)), min_size=1, max_size=6),
       st.integers(0, 2**32))
def test_a_row_draws_the_same_whatever_the_batch_around_it(rows, logit_seed):
    """Each row's token and log-prob depend on its own logits, parameters and seed only; greedy
    rows are the argmax; a drawn token is inside the row's top-k and top-p support."""
    logits = torch.randn(len(rows), 40, generator=torch.Generator().manual_seed(logit_seed))
    params = [SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p, _ in rows]
    seeds = [seed for *_, seed in rows]
    batch = sample_rows(logits, _rows(params, seeds))
    for i, (temperature, top_k, top_p, seed) in enumerate(rows):
        alone = sample_rows(logits[i : i + 1], _rows([params[i]], [seed]))[0]
        assert torch.equal(alone, batch[i])
        token, logprob, failed = batch[i].tolist()
        assert failed == -1
        if temperature == 0.0:
            assert token == int(logits[i].argmax())
            continue
        assert logprob == pytest.approx(float(torch.log_softmax(logits[i] / temperature, -1)[int(token)]), abs=1e-5)
        order = torch.argsort(logits[i], descending=True).tolist()
        if top_k:
            assert order.index(int(token)) < top_k
        probs = torch.softmax(logits[i] / temperature, -1)[order]
        rank = order.index(int(token))
        assert rank == 0 or float(probs[:rank].sum()) < top_p + 1e-6


def test_nan_logits_fail_their_row_alone():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(2))
    logits[1, 4] = float("nan")
    out = sample_rows(logits, _rows([SamplingParams(temperature=1.0)] * 3, [1, 2, 3]))
    assert out[:, 2].tolist() == [-1.0, 1.0, -1.0]  # row 1: one NaN logit, not sampled from
