"""The trainer's forward pass: a causal LM's decoder, then the log-probs and entropy of the
trained tokens from the final hidden states, chunk by chunk (`chunked_logprobs.py`).

The LM head runs only at positions whose target was generated: prompt and tool-output tokens
need no logits. No [tokens, vocab] tensor exists at any time, forward or backward.

It is a module wrapping the Hugging Face model so that FSDP2 can shard it as its root: the
decoder's embedding and the LM head (tied in Qwen3) are gathered by the root's forward hook for
the chunks, and their gradients reduced after backward like any other unit's.
"""

from __future__ import annotations

import torch
from torch import nn

from venusrl.trainer.chunked_logprobs import chunked_logprobs_and_entropy
from venusrl.trainer.rows import Rows
from venusrl.trainer.shared_prefix import causal_lm_hidden


class PolicyForward(nn.Module):
    def __init__(self, lm: nn.Module, chunk_tokens: int, temperature: float, compute_dtype: torch.dtype) -> None:
        """`lm`: a Hugging Face causal LM whose logits are `get_output_embeddings()` (a linear
        layer without bias) of `get_decoder()`'s last hidden state; `temperature`: logits are
        divided by it (the rollout's sampling temperature); `compute_dtype`: of the LM head's
        matmuls (the decoder's follows the autocast or FSDP policy around the call)."""
        super().__init__()
        head = lm.get_output_embeddings()
        if not isinstance(head, nn.Linear) or head.bias is not None:
            raise ValueError(f"{type(lm).__name__}: the LM head must be a linear layer without bias, got {head!r}")
        self.lm, self.chunk_tokens, self.temperature, self.compute_dtype = lm, chunk_tokens, temperature, compute_dtype

    def forward(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(target) and entropy, [B, L] float32, 0 wherever `rows.mask` is False."""
        decoder = self.lm.get_decoder()
        if rows.position_ids is not None:
            # no cache: transformers reads packed rows from the position ids only without one
            hidden = decoder(input_ids=rows.ids, position_ids=rows.position_ids, use_cache=False).last_hidden_state
        else:
            hidden = causal_lm_hidden(decoder, rows.ids, rows.attention, rows.prefix)
        logprobs, entropy = chunked_logprobs_and_entropy(
            hidden[rows.mask], self.lm.get_output_embeddings().weight, rows.targets[rows.mask], self.chunk_tokens,
            self.temperature, self.compute_dtype)
        return _scattered(logprobs, rows.mask), _scattered(entropy, rows.mask)


def _scattered(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)
