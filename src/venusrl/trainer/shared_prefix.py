"""Forward passes that compute a batch's common token prefix once.

The K trajectories of a group start with the same prompt, and in agentic tasks the prompt
(system message, tool schemas) is most of the tokens. Running the prefix once and the K
suffixes on top of its KV cuts the trainer's work by up to K times; gradients flow through
the shared cache into the prefix, so the result equals the plain batched forward (a test
checks logits and gradients).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence


def common_prefix_length(sequences: list[list[int]]) -> int:
    """Tokens every sequence shares from the start, leaving each at least one token of its own."""
    shortest = min(len(s) for s in sequences)
    first = sequences[0]
    length = 0
    while length < shortest - 1 and all(s[length] == first[length] for s in sequences):
        length += 1
    return length


def causal_lm_logits(model: nn.Module, ids: torch.Tensor, attention: torch.Tensor, prefix: int) -> torch.Tensor:
    """Logits [B, T, V] of right-padded `ids` whose first `prefix` tokens are the same in
    every row. With `prefix` 0 (or one row) it is the plain forward."""
    return model.get_output_embeddings()(causal_lm_hidden(model.get_decoder(), ids, attention, prefix))


def causal_lm_hidden(decoder: nn.Module, ids: torch.Tensor, attention: torch.Tensor, prefix: int) -> torch.Tensor:
    """The final hidden states [B, T, H] (what the LM head turns into logits) of a causal LM's
    decoder (`model.get_decoder()`), as `causal_lm_logits` lays out its input."""
    batch = ids.shape[0]
    if prefix == 0 or batch == 1:
        return decoder(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    # transformers 5 names the KV cache `cache`; 4.x `past_key_values`
    name = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    head = decoder(input_ids=ids[:1, :prefix], use_cache=True)
    cache = getattr(head, name)
    cache.batch_repeat_interleave(batch)
    tail = decoder(input_ids=ids[:, prefix:], attention_mask=attention, **{name: cache}).last_hidden_state
    return torch.cat([head.last_hidden_state.expand(batch, -1, -1), tail], dim=1)


def right_padded(rows: list[list], dtype: torch.dtype, padding_value: float = 0) -> torch.Tensor:
    """[B, longest]: each row from the left, `padding_value` after it (the layout
    `causal_lm_logits` takes)."""
    return pad_sequence([torch.tensor(row, dtype=dtype) for row in rows], batch_first=True, padding_value=padding_value)
