"""Runs a scheduler batch on the model: one packed forward over the paged KV pool, then
sampling for the items that need a token. A request whose sampling fails is reported in
`Sampled.errors` and fails alone; an error in the forward is the whole engine's."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from venusrl.engine.batch import Batch
from venusrl.engine.kv_pool import KVPool
from venusrl.engine.paged_attention import ATTENTION_BACKENDS, SequenceSlots
from venusrl.model.causal_lm import CausalLM
from venusrl.model.sampling import greedy, is_greedy, position_seed, sample
from venusrl.weights.copy import copy_into


@dataclass(slots=True, frozen=True)
class SampledToken:
    token: int
    logprob: float


@dataclass(slots=True)
class Sampled:
    """What one batch sampled: a token per request, or the error that failed that request."""

    tokens: dict[str, SampledToken] = field(default_factory=dict)
    errors: dict[str, Exception] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: CausalLM, kv_capacity_tokens: int, seed: int = 0,
                 attention_backend: str = "sdpa", host_kv_capacity_tokens: int = 0):
        weight = model.model.embed_tokens.weight
        model.fuse_projections()
        self.model = model
        self.device = weight.device
        self.pool = KVPool(model.args, kv_capacity_tokens, weight.dtype, weight.device,
                           host_kv_capacity_tokens)
        self.attention = ATTENTION_BACKENDS[attention_backend](self.pool)
        # requests without a seed draw from one engine-wide stream
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def run(self, batch: Batch) -> Sampled:
        for copy in batch.kv_copies:  # before the forward: it may overwrite a page just saved
            self.pool.copy(copy)
        items = batch.items
        # built for an empty batch too: decode rows outlive only consecutive forwards
        context = self.attention.context(
            [SequenceSlots(item.request_id, len(item.token_ids), item.context_slots) for item in items])
        if not items:
            return Sampled()
        ids = torch.tensor([[t for item in items for t in item.token_ids]], device=self.device)
        positions = torch.tensor([[p for item in items for p in item.positions]], device=self.device)
        hidden = self.model.hidden_states(ids, positions, context)[0]
        ends = torch.tensor([len(item.token_ids) for item in items], device=self.device).cumsum(0) - 1
        sampled_items = [i for i, item in enumerate(items) if item.sample]
        out = Sampled()
        if not sampled_items:
            return out
        logits = self.model.lm_head(hidden[ends[sampled_items]])
        greedy_rows = [row for row, index in enumerate(sampled_items) if is_greedy(items[index].sampling)]
        if greedy_rows:
            tokens, logprobs = greedy(logits[greedy_rows])
            for row, token, logprob in zip(greedy_rows, tokens, logprobs, strict=True):
                out.tokens[items[sampled_items[row]].request_id] = SampledToken(token, logprob)
        for row, index in enumerate(sampled_items):
            item = items[index]
            if is_greedy(item.sampling):
                continue
            try:
                generator = self.generator
                if item.sampling.seed is not None:
                    # seed + position in the output: reproducible across retraction and resume
                    seed = position_seed(item.sampling.seed, item.num_generated)
                    generator = torch.Generator(device=self.device).manual_seed(seed)
                token, logprob = sample(logits[row], item.sampling, generator)
            except Exception as err:  # this request's alone: the batch's other rows are fine
                out.errors[item.request_id] = err
                continue
            out.tokens[item.request_id] = SampledToken(token, logprob)
        return out

    def check_weights(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors `load_weights` copies, once every one is known to fit: every parameter
        given (names as in Hugging Face checkpoints; a tied `lm_head.weight` may be left out),
        no unknown name, each of the parameter's shape and of a floating dtype (cast on the
        copy). ValueError naming the first tensor that does not fit."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        tied = self.model.args.tie_word_embeddings
        missing = [n for n in params if n not in state_dict and not (tied and n == "lm_head.weight")]
        unknown = [n for n in state_dict if n not in params and not n.endswith("rotary_emb.inv_freq")]
        if missing or unknown:
            raise ValueError(f"update_weights: missing {missing[:3]}, unknown {unknown[:3]}")
        updates = {n: t for n, t in state_dict.items() if n in params and not (tied and n == "lm_head.weight")}
        for name, tensor in updates.items():
            if params[name].shape != tensor.shape:
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(tensor.shape)}, expected {tuple(params[name].shape)}"
                )
            if not tensor.is_floating_point():
                raise ValueError(f"update_weights: {name} has dtype {tensor.dtype}, expected a floating dtype "
                                 f"(the engine's is {params[name].dtype})")
        return updates

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy new weights in place, cast to the engine's dtype on its device (from tensors on
        any device: the trainer's GPU, host memory, a shared-memory mapping). All are checked
        before the first is copied, so a bad update changes nothing."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        for name, tensor in self.check_weights(state_dict).items():
            copy_into(params[name], tensor)
        if self.device.type == "cuda":  # the copies are read by the next forward and freed by the caller
            torch.cuda.current_stream(self.device).synchronize()
