"""Single-sequence generation with a dense KV cache: the model layer's own reference path.
The engine batches and pages; this is what its output is checked against."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from venusrl.model.attention import sdpa
from venusrl.model.causal_lm import CausalLM
from venusrl.model.sampling import sample
from venusrl.types import SamplingParams


class DenseKVCache:
    """K/V of one batch in contiguous tensors; the tokens of a forward call are appended
    at `length`, and each query sees every cached key plus the new keys up to itself."""

    def __init__(self, model: CausalLM, batch: int, capacity: int):
        args = model.args
        weight = model.model.embed_tokens.weight
        shape = (args.num_hidden_layers, batch, capacity, args.num_key_value_heads, args.head_dim)
        self.k = torch.empty(shape, dtype=weight.dtype, device=weight.device)
        self.v = torch.empty(shape, dtype=weight.dtype, device=weight.device)
        self.capacity = capacity
        self.length = 0

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        new = q.shape[1]
        end = self.length + new
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} tokens; {end} requested")
        self.k[layer_idx, :, self.length : end] = k
        self.v[layer_idx, :, self.length : end] = v
        keys, values = self.k[layer_idx, :, :end], self.v[layer_idx, :, :end]
        if self.length == 0:
            return sdpa(q, keys, values, mask=None, causal=True)
        mask = torch.ones(new, end, dtype=torch.bool, device=q.device).tril(diagonal=self.length)
        return sdpa(q, keys, values, mask=mask, causal=False)

    def advance(self, tokens: int) -> None:
        self.length += tokens


@dataclass(slots=True)
class Generation:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"  # "stop" when a stop token ended it


@torch.no_grad()
def generate(model: CausalLM, prompt_ids: list[int], params: SamplingParams) -> Generation:
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    device = model.model.embed_tokens.weight.device
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    cache = DenseKVCache(model, batch=1, capacity=len(prompt_ids) + params.max_new_tokens)
    stops = set(params.stop_token_ids or model.args.eos_token_ids)
    out = Generation()
    inputs = torch.tensor([prompt_ids], device=device)
    for _ in range(params.max_new_tokens):
        positions = torch.arange(cache.length, cache.length + inputs.shape[1], device=device)[None]
        logits = model(inputs, positions, cache)
        cache.advance(inputs.shape[1])
        token, logprob = sample(logits[0, -1], params, generator)
        out.token_ids.append(token)
        out.logprobs.append(logprob)
        if token in stops:
            out.finish_reason = "stop"
            break
        inputs = torch.tensor([[token]], device=device)
    return out
