import pytest
import torch

from venusrl.model.sampling import sample
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
