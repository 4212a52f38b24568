"""Computing a batch's common prefix once gives the plain forward's logits and gradients."""

from __future__ import annotations

import torch
import transformers
from hypothesis import given
from hypothesis import strategies as st

from venusrl.trainer.shared_prefix import causal_lm_logits, common_prefix_length


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=5))
def test_common_prefix_is_shared_and_leaves_every_row_a_token(sequences):
    length = common_prefix_length(sequences)
    assert all(s[:length] == sequences[0][:length] for s in sequences)
    assert all(len(s) > length for s in sequences)
    longer = length + 1
    if all(len(s) > longer for s in sequences):
        assert any(s[length] != sequences[0][length] for s in sequences)


def test_shared_prefix_forward_matches_the_plain_forward(tiny_model_dir):
    torch.manual_seed(0)
    shared, plain = (transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
                     for _ in range(2))
    prompt = torch.randint(0, 200, (40,)).tolist()
    sequences = [prompt + torch.randint(0, 200, (n,)).tolist() for n in (6, 11, 2, 9)]
    width = max(map(len, sequences))
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
        attention[row, : len(sequence)] = 1
    prefix = common_prefix_length(sequences)
    assert prefix == 40
    real = attention.bool()
    fast, slow = causal_lm_logits(shared, ids, attention, prefix), causal_lm_logits(plain, ids, attention, 0)
    torch.testing.assert_close(fast[real], slow[real], atol=1e-5, rtol=1e-4)
    fast[real].logsumexp(-1).sum().backward()
    slow[real].logsumexp(-1).sum().backward()
    for (name, p), q in zip(shared.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3, msg=name)
