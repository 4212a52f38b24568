"""Log-probs and entropy computed chunk by chunk from hidden states equal the full
[tokens, vocab] computation (`losses.token_logprobs_and_entropy`), values and gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from venusrl.trainer.chunked_logprobs import chunked_logprobs_and_entropy
from venusrl.trainer.losses import token_logprobs_and_entropy


def _full(hidden, weight, labels, temperature, dtype):
    return token_logprobs_and_entropy((hidden.to(dtype) @ weight.to(dtype).T).float() / temperature, labels)


def _values_and_grads(fn, hidden, weight, labels, upstream):
    """fn's outputs and the gradients of Σ g_ℓ·ℓ + g_H·H (None for an absent upstream)."""
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logprobs, entropy = fn(hidden, weight)
    total = sum((out * g).sum() for out, g in zip((logprobs, entropy), upstream, strict=True) if g is not None)
    total.backward()
    return logprobs.detach(), entropy.detach(), hidden.grad, weight.grad


@given(tokens=st.integers(1, 40), width=st.integers(1, 12), vocab=st.integers(2, 70), chunk=st.integers(1, 50),
       temperature=st.sampled_from([1.0, 0.6, 1.7]), ignored=st.floats(0.0, 0.5),
       upstream=st.sampled_from(["both", "logprobs", "entropy"]), seed=st.integers(0, 2**16))
def test_chunked_equals_the_full_computation(tokens, width, vocab, chunk, temperature, ignored, upstream, seed):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=generator, dtype=torch.float64) * 2
    weight = torch.randn(vocab, width, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, vocab, (tokens,), generator=generator)
    labels[torch.rand(tokens, generator=generator) < ignored] = -100
    grads = (torch.randn(tokens, generator=generator, dtype=torch.float64) if upstream != "entropy" else None,
             torch.randn(tokens, generator=generator, dtype=torch.float64) if upstream != "logprobs" else None)
    # float64 inputs and matmuls, the softmax in float32 in both: they agree to its rounding, whatever the chunking
    chunked = _values_and_grads(lambda h, w: chunked_logprobs_and_entropy(h, w, labels, chunk, temperature,
                                                                         torch.float64), hidden, weight, labels, grads)
    full = _values_and_grads(lambda h, w: _full(h, w, labels, temperature, torch.float64), hidden, weight, labels,
                             grads)
    # the outputs are float32 by contract (as token_logprobs_and_entropy's)
    for got, expected, name in zip(chunked, full, ("logprobs", "entropy", "hidden grad", "weight grad"), strict=True):
        torch.testing.assert_close(got.double(), expected.double(), atol=1e-5, rtol=1e-5, msg=name)
    assert (chunked[0][labels < 0] == 0).all()


def test_bf16_matmuls_agree_with_the_full_bf16_computation():
    """Under mixed precision both compute the logits in bf16 and the softmax in float32; the
    gradients differ by bf16 rounding (the full path rounds the weight's gradient once, the
    chunked path once a chunk, summing in float32)."""
    generator = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(64, 32, generator=generator), torch.randn(500, 32, generator=generator) * 0.1
    labels = torch.randint(0, 500, (64,), generator=generator)
    grads = (torch.randn(64, generator=generator), torch.randn(64, generator=generator))
    chunked = _values_and_grads(lambda h, w: chunked_logprobs_and_entropy(h, w, labels, 16, 1.0, torch.bfloat16),
                                hidden, weight, labels, grads)
    full = _values_and_grads(lambda h, w: _full(h, w, labels, 1.0, torch.bfloat16), hidden, weight, labels, grads)
    for got, expected, name in zip(chunked, full, ("logprobs", "entropy", "hidden grad", "weight grad"), strict=True):
        assert got.dtype == expected.dtype, name
        scale = float(expected.abs().max())
        torch.testing.assert_close(got, expected, atol=1e-2 * scale, rtol=0, msg=name)


def test_the_weight_gradient_has_the_weight_dtype():
    hidden = torch.randn(5, 4, requires_grad=True)
    weight = torch.randn(9, 4, dtype=torch.bfloat16, requires_grad=True)
    logprobs, _ = chunked_logprobs_and_entropy(hidden, weight, torch.arange(5), 2, compute_dtype=torch.bfloat16)
    logprobs.sum().backward()
    assert weight.grad.dtype == torch.bfloat16 and hidden.grad.dtype == torch.float32


@pytest.mark.parametrize(("hidden", "weight", "labels", "chunk", "match"), [
    ((4, 3), (7, 2), (4,), 2, "hidden must be"),
    ((4, 3), (7, 3), (5,), 2, "labels must be"),
    ((4, 3), (7, 3), (4,), 0, "chunk_tokens"),
])
def test_bad_shapes_are_named(hidden, weight, labels, chunk, match):
    with pytest.raises(ValueError, match=match):
        chunked_logprobs_and_entropy(torch.zeros(hidden), torch.zeros(weight), torch.zeros(labels, dtype=torch.long),
                                     chunk)


def test_autocast_does_not_round_the_softmax_math():
    """The trainer calls it under autocast, which would run the entropy's reduction on
    bf16-rounded probabilities: the values must be those computed without it."""
    generator = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(32, 64, generator=generator), torch.randn(5000, 64, generator=generator) * 0.01
    labels = torch.randint(0, 5000, (32,), generator=generator)
    plain = chunked_logprobs_and_entropy(hidden, weight, labels, 8, 1.0, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = chunked_logprobs_and_entropy(hidden, weight, labels, 8, 1.0, torch.bfloat16)
    assert float(plain[1].mean()) > 8  # near-uniform over 5,000 entries: where bf16 rounding shows
    for got, expected in zip(under, plain, strict=True):
        assert got.dtype == torch.float32 and torch.equal(got, expected)
