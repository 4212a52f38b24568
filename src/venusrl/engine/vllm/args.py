"""vLLM's arguments from ours: the engine's from `EngineConfig`, a request's from our
`SamplingParams` (both as our engine reads them)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from vllm import SamplingParams as VLLMSamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind

from venusrl.engine.config import EngineConfig
from venusrl.engine.vllm.tiers import CONFIG_KEY, TRAJECTORY_ARG
from venusrl.model.sampling import GREEDY_BELOW
from venusrl.types import SamplingParams

log = logging.getLogger(__name__)

_SCHEDULER = "venusrl.engine.vllm.tiers.TrajectoryScheduler"
_WORKER_EXTENSION = "venusrl.engine.vllm.worker.VenusWorkerExtension"
_CPU_BLOCK_MULTIPLE = 32  # vLLM 0.32's CPU attention refuses other block sizes


def engine_args(model_dir: str | Path, config: EngineConfig, *, dtype: str = "float32", seed: int = 0,
                max_model_len: int | None = None) -> AsyncEngineArgs:
    """vLLM's arguments for our engine config: the same KV capacity (in tokens, converted to
    bytes for the model's KV layout), batch bound, prefill budget and page size; the cache
    policy and demotion go to our scheduler class (vllm/tiers.py) through `additional_config`."""
    if config.kv_after_weight_update != "recompute":
        raise ValueError(
            "engine.kv_after_weight_update: only recompute works with engine.backend: vllm. With keep (vLLM "
            "pausing in-flight requests and carrying on over their KV), the first token after the switch was "
            "at times neither the old weights' nor the new ones' (vLLM 0.32 CPU, timing-dependent)")
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(model_dir))
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    element = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    kv_bytes_per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * head_dim * element
    block_size = config.page_size
    if current_platform.is_cpu() and block_size % _CPU_BLOCK_MULTIPLE:
        block_size = -(-block_size // _CPU_BLOCK_MULTIPLE) * _CPU_BLOCK_MULTIPLE
        log.info("engine.page_size %d rounded up to %d: vLLM's CPU attention takes multiples of %d",
                 config.page_size, block_size, _CPU_BLOCK_MULTIPLE)
    # vLLM's block pool keeps one block as its null block (never holds KV): one more is allocated
    # so the usable capacity is ours, rounded up to whole blocks
    kv_blocks = -(-config.kv_capacity_tokens // block_size) + 1
    return AsyncEngineArgs(
        # eager on CPU (torch.compile would take minutes on two cores), CUDA graphs on GPUs
        model=str(model_dir), dtype=dtype, seed=seed, enforce_eager=current_platform.is_cpu(),
        max_model_len=max_model_len or min(hf.max_position_embeddings, config.kv_capacity_tokens),
        kv_cache_memory_bytes=kv_blocks * block_size * kv_bytes_per_token, block_size=block_size,
        max_num_seqs=config.max_running_requests,
        max_num_batched_tokens=max(config.max_prefill_tokens, config.max_running_requests),
        enable_prefix_caching=True, scheduling_policy="priority", scheduler_cls=_SCHEDULER,
        additional_config={CONFIG_KEY: {"cache_policy": config.cache_policy, "demotion": config.demotion,
                                        "demotion_order": config.demotion_order,
                                        "work_conservation": config.work_conservation}},
        worker_extension_cls=_WORKER_EXTENSION, logprobs_mode="processed_logprobs",
        disable_log_stats=True,  # vLLM's own loggers off; ours (vllm/stats.py) get every step's stats,
        enable_logging_iteration_details=True,  # with its timed iteration (our step log)
    )


def vllm_params(sampling: SamplingParams, produced: int, trajectory_id: str | None = None) -> VLLMSamplingParams:
    """vLLM's sampling parameters for the rest of a request that has produced `produced`
    tokens, naming its trajectory to our scheduler (vllm/tiers.py) in `extra_args`. Explicit stop token ids replace the model's end-of-turn ones, as in our engine.
    A seeded request's continuation is seeded at its position (so a re-issue is reproducible,
    though not the same random stream as an uninterrupted run; greedy runs are the same)."""
    greedy = sampling.temperature < GREEDY_BELOW
    stop_ids = [t for t in sampling.stop_token_ids if t >= 0]
    return VLLMSamplingParams(
        max_tokens=sampling.max_new_tokens - produced,
        temperature=0.0 if greedy else sampling.temperature,
        top_p=sampling.top_p, top_k=sampling.top_k or -1,
        seed=None if sampling.seed is None else sampling.seed + produced,
        stop_token_ids=stop_ids, ignore_eos=bool(sampling.stop_token_ids), stop=list(sampling.stop) or None,
        logprobs=0, output_kind=RequestOutputKind.DELTA, detokenize=bool(sampling.stop),
        extra_args=None if trajectory_id is None else {TRAJECTORY_ARG: trajectory_id},
    )
