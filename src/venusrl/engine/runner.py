"""Runs a scheduler batch on the model: one packed forward over the paged KV pool (or, for a
decode-only batch with CUDA graphs, one graph replay), then sampling on the device for the
items that need a token, with one device-to-host copy for the whole step. A request whose
sampling fails (non-finite probabilities) is reported in `Sampled.errors` and fails alone; an
error in the forward is the whole engine's."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

import torch

from venusrl.engine.attention import SequenceSlots, make_backend, resolve_backend
from venusrl.engine.batch import Batch, ScheduledRequest
from venusrl.engine.kv_pool import KVPool
from venusrl.model.causal_lm import CausalLM
from venusrl.model.sampling import SamplingRows, position_seed, sample_rows, sampling_error
from venusrl.weights.copy import copy_into

log = logging.getLogger(__name__)


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
    def __init__(self, model: CausalLM, kv_capacity_tokens: int, seed: int = 0, attention_backend: str = "auto",
                 host_kv_capacity_tokens: int = 0, max_running_requests: int = 64, cuda_graphs: bool = True):
        weight = model.model.embed_tokens.weight
        model.fuse_projections()
        self.model = model
        self.device = weight.device
        self.pool = KVPool(model.args, kv_capacity_tokens, weight.dtype, weight.device,
                           host_kv_capacity_tokens)
        self.backend_name = resolve_backend(attention_backend, self.device)
        self.attention = make_backend(self.backend_name, self.pool, max_running_requests)
        # requests without a seed draw theirs from one engine-wide stream
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.graphs = None
        if cuda_graphs and self.device.type == "cuda":
            if self.backend_name == "triton":
                from venusrl.engine.cuda_graphs import DecodeGraphs

                self.graphs = DecodeGraphs(model, self.attention, max_running_requests)
            else:
                log.info("engine.cuda_graphs: the %s attention backend runs eagerly (graphs need triton)",
                         self.backend_name)

    @torch.inference_mode()
    def run(self, batch: Batch) -> Sampled:
        for copy in batch.kv_copies:  # before the forward: it may overwrite a page just saved
            self.pool.copy(copy)
        items = batch.items
        sequences = [SequenceSlots(item.request_id, len(item.token_ids), item.context_slots) for item in items]
        sampled_items = [i for i, item in enumerate(items) if item.sample]
        # the sampling parameters go to the device before the forward is launched: their copies
        # then wait on an idle device, not on the forward
        rows = self._sampling_rows([items[i] for i in sampled_items]) if sampled_items else None
        if self.graphs is not None and all(len(item.token_ids) == 1 for item in items) \
                and self.graphs.fits(len(items)):
            step = self.attention.decode_step(sequences, [item.token_ids[0] for item in items],
                                              [item.positions[0] for item in items])
            logits = self.graphs.run(step)
            if not sampled_items:
                return Sampled()
            if len(sampled_items) < len(items):
                logits = logits[torch.tensor(sampled_items, device=self.device)]
        else:
            # built for an empty batch too: state kept across steps outlives only consecutive forwards
            context = self.attention.context(sequences)
            if not items:
                return Sampled()
            ids = torch.tensor([[t for item in items for t in item.token_ids]], device=self.device)
            positions = torch.tensor([[p for item in items for p in item.positions]], device=self.device)
            hidden = self.model.hidden_states(ids, positions, context)[0]
            if not sampled_items:
                return Sampled()
            ends = list(itertools.accumulate(len(item.token_ids) for item in items))
            last = torch.tensor([ends[i] - 1 for i in sampled_items], device=self.device)
            logits = self.model.lm_head(hidden[last])
        drawn = sample_rows(logits, rows).tolist()  # the step's one device-to-host copy
        out = Sampled()
        for item, (token, logprob, failed) in zip([items[i] for i in sampled_items], drawn, strict=True):
            if failed >= 0:  # this request's alone: the batch's other rows are fine
                out.errors[item.request_id] = sampling_error(item.sampling, int(failed))
            else:
                out.tokens[item.request_id] = SampledToken(int(token), logprob)
        return out

    def _sampling_rows(self, items: list[ScheduledRequest]) -> SamplingRows:
        params = [item.sampling for item in items]
        # seed + position in the output: reproducible across retraction and resume
        seeds = [None if p.seed is None else position_seed(p.seed, item.num_generated)
                 for p, item in zip(params, items, strict=True)]
        return SamplingRows.build(params, seeds, self.device, self.generator)

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
