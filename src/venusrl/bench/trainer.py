"""`venusrl bench trainer`: what one GRPO step of the trainer costs (issue 36).

- loss_path: peak memory of the loss path alone, from the final hidden states [tokens, hidden]
  and the LM head [vocab, hidden] to the gradients of both, for the chunked computation the
  trainer runs (`trainer/chunked_logprobs.py`) against the full one (logits [tokens, vocab],
  `losses.token_logprobs_and_entropy`). Memory is `bench/tensor_memory.py`'s count of the bytes
  of tensors alive at once. The chunked path runs for real on the device; the full one, 20 GB and
  more at the headline size, runs on a GPU and is counted on the meta device elsewhere (same
  operators, no memory). Both then run on the device, interleaved, at a size it holds: their
  seconds side by side, and its counts equal to the meta device's (`cross_check`).
- steps: GRPO steps of a model of an official shape (random weights built here, nothing
  downloaded) on groups of ROWS x TOKENS: step time, tokens/s, peak memory (CUDA: the
  allocator's `max_memory_allocated`; elsewhere the tensor count over the step) and, on a GPU
  with a known bf16 peak, the MFU.
- weight_push: seconds a push of the float32 master weights takes to reach an engine in
  model.dtype, per engine placement, paired with today's path (`bench/weight_push.py`).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from venusrl.bench.report import emit
from venusrl.bench.tensor_memory import TensorMemory
from venusrl.model.checkpoint import resolve_dtype
from venusrl.model.shapes import QWEN3_SHAPES as SHAPES
from venusrl.model.shapes import qwen3_config
from venusrl.trainer.chunked_logprobs import chunked_logprobs_and_entropy
from venusrl.trainer.config import TrainerConfig
from venusrl.trainer.losses import token_logprobs_and_entropy
from venusrl.trainer.streaming import StreamingTrainer
from venusrl.types import Group, Prompt, Trajectory, TrajectoryStatus

# Dense bf16 peak FLOP/s by a substring of torch.cuda.get_device_name (vendor data sheets).
BF16_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12,
                   "L40S": 362e12, "B200": 2250e12}


@dataclass(frozen=True, slots=True)
class StepCase:
    rows: int
    tokens: int  # per row, the shared prompt included

    @classmethod
    def parse(cls, text: str) -> StepCase:
        try:
            rows, tokens = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"{text!r} is not ROWSxTOKENS (e.g. 8x2048)") from None
        if rows < 1 or tokens < 2:
            raise ValueError(f"{text!r}: need at least 1 row of at least 2 tokens")
        return cls(rows, tokens)

    def __str__(self) -> str:
        return f"{self.rows}x{self.tokens}"


@dataclass(frozen=True, slots=True)
class BenchOptions:
    device: str
    shape: str
    cases: tuple[StepCase, ...]
    prompt_tokens: int
    dtype: str  # model.dtype: the compute dtype; the master weights are float32
    chunk_tokens: int
    activation_checkpointing: bool
    micro_batch_tokens: int
    steps: int  # timed steps a case, after one warm-up step
    loss_tokens: int  # the loss path's tokens
    loss_vocab: int
    loss_hidden: int
    push_repeats: int = 1  # interleaved repeats of every weight-push placement; 0: none


def run(options: BenchOptions) -> dict[str, Any]:
    device = torch.device(options.device)
    result: dict[str, Any] = {"device": _device_name(device), "torch": torch.__version__,
                              "model_dtype": options.dtype, "master_dtype": "float32"}
    with Progress() as progress:
        task = progress.add_task("trainer bench", total=2 + len(options.cases) * (options.steps + 1))
        result["loss_path"] = loss_path(options, device, lambda: progress.advance(task))
        result["steps"] = {str(case): step_case(options, case, device, lambda: progress.advance(task))
                           for case in options.cases}
        result["weight_push"] = _weight_push(options)
    return result


def main(options: BenchOptions, json_out: Path | None) -> None:
    emit(run(options), json_out)


# --- loss path ---------------------------------------------------------------------------

def loss_path(options: BenchOptions, device: torch.device, advance: Callable[[], None]) -> dict[str, Any]:
    dtype = resolve_dtype(options.dtype)
    tokens, vocab, hidden, chunk = options.loss_tokens, options.loss_vocab, options.loss_hidden, options.chunk_tokens
    # a GPU holds the full path at the headline size (25 GB at 8k tokens); this CPU does not
    full_on = device if device.type == "cuda" else _META
    chunked = _loss_peak("chunked", tokens, vocab, hidden, chunk, dtype, device)
    full = _loss_peak("full", tokens, vocab, hidden, chunk, dtype, full_on)
    advance()
    # both paths on the device, interleaved (full, chunked, full, ...): their seconds side by
    # side, and the device's counts against the meta device's
    small = tokens if device.type == "cuda" else min(tokens, 1024)
    pairs = [tuple(_loss_peak(path, small, vocab, hidden, chunk, dtype, device) for path in ("full", "chunked"))
             for _ in range(TIMING_PAIRS)]
    advance()
    return {
        "tokens": tokens, "vocab": vocab, "hidden": hidden, "chunk_tokens": chunk, "compute_dtype": options.dtype,
        "chunked": {**chunked, "counted_on": device.type}, "full": {**full, "counted_on": full_on.type},
        "chunked_over_full": round(chunked["peak_bytes"] / full["peak_bytes"], 4),
        "one_chunk_logits_bytes": chunk * vocab * 4, "full_logits_bytes": tokens * vocab * 4,
        # the chunked peak at other chunk sizes and the full one at other token counts (counted on meta)
        "chunked_peak_by_chunk": {c: _loss_peak("chunked", tokens, vocab, hidden, c, dtype, _META)["peak_bytes"]
                                  for c in sorted({chunk // 4 or 1, chunk, chunk * 4})},
        "full_peak_by_tokens": {t: _loss_peak("full", t, vocab, hidden, chunk, dtype, _META)["peak_bytes"]
                                for t in sorted({tokens // 4 or 1, tokens // 2 or 1, tokens})},
        "cross_check": {"tokens": small, "full_device": pairs[0][0]["peak_bytes"],
                        "chunked_device": pairs[0][1]["peak_bytes"],
                        **{f"{path}_meta": _loss_peak(path, small, vocab, hidden, chunk, dtype, _META)["peak_bytes"]
                           for path in ("full", "chunked")}},
        "seconds_paired": {"tokens": small, "order": "full, chunked, full, chunked, ...",
                           "full_s": [full_run["seconds"] for full_run, _ in pairs],
                           "chunked_s": [chunked_run["seconds"] for _, chunked_run in pairs]},
    }


TIMING_PAIRS = 3
_META = torch.device("meta")


def _loss_peak(path: str, tokens: int, vocab: int, hidden: int, chunk: int, dtype: torch.dtype,
               device: torch.device) -> dict[str, Any]:
    """Forward and backward of Σ advantage·log p + 0.01·entropy over `tokens` sampled tokens:
    the peak bytes of the tensors it allocates (inputs and the master weight excluded), and
    the seconds it took (0 on meta)."""
    states, weight, labels = _loss_inputs(tokens, vocab, hidden, dtype, device)
    advantages = torch.ones(tokens, device=device)
    _synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    started = time.perf_counter()
    with TensorMemory() as memory:
        if path == "chunked":
            logprobs, entropy = chunked_logprobs_and_entropy(states, weight, labels, chunk, compute_dtype=dtype)
        else:  # what autocast runs: the LM head in the compute dtype, the softmax in float32
            logprobs, entropy = token_logprobs_and_entropy(states @ weight.to(dtype).T, labels)
        ((advantages * logprobs).sum() + 0.01 * entropy.sum()).backward()
        del logprobs, entropy
    _synchronize(device)
    out = {"peak_bytes": memory.peak_bytes, "peak_gib": round(memory.peak_bytes / 2**30, 3),
           "seconds": round(time.perf_counter() - started, 3) if device.type != "meta" else 0.0}
    if device.type == "cuda":  # the allocator's own figure for the same region
        out["allocator_peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
    return out


def _loss_inputs(tokens: int, vocab: int, hidden: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states [tokens, hidden] in the compute dtype, the LM head [vocab, hidden] in float32
    (the master), labels [tokens]; random, or uninitialised on meta."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, vocab, (tokens,), generator=generator).to(device)
    if device.type == "meta":
        return (torch.empty(tokens, hidden, dtype=dtype, device=device).requires_grad_(),
                torch.empty(vocab, hidden, device=device).requires_grad_(), labels)
    states = torch.randn(tokens, hidden, generator=generator).to(device=device, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden, generator=generator) * 0.02).to(device).requires_grad_()
    return states, weight, labels


# --- steps -------------------------------------------------------------------------------

def step_case(options: BenchOptions, case: StepCase, device: torch.device, advance: Callable[[], None]) -> dict:
    shape = SHAPES[options.shape]
    model = build_model(shape, device)
    params = sum(p.numel() for p in model.parameters())
    config = TrainerConfig(learning_rate=1e-6, logprob_chunk_tokens=options.chunk_tokens,
                           activation_checkpointing=options.activation_checkpointing,
                           micro_batch_tokens=options.micro_batch_tokens)
    trainer = StreamingTrainer(model, config, compute_dtype=resolve_dtype(options.dtype))
    group = bench_group(case, min(options.prompt_tokens, case.tokens - 1), shape["vocab"])
    times, peaks = [], []
    for _ in range(options.steps + 1):  # the first warms the allocator and kernels up
        with _peak_memory(device) as peak:
            _synchronize(device)
            started = time.perf_counter()
            trainer.accumulate(group)
            result = trainer.step()
            _synchronize(device)
        times.append(time.perf_counter() - started)
        peaks.append(peak["bytes"])
        advance()
    started = time.perf_counter()
    weights = trainer.engine_weights()
    engine_weights_s = time.perf_counter() - started
    tokens = case.rows * case.tokens
    step_s = min(times[1:])
    flops = model_flops(shape, params, case)
    out = {
        "params": params, "rows": case.rows, "tokens_per_row": case.tokens, "tokens": tokens,
        "prompt_tokens": min(options.prompt_tokens, case.tokens - 1),
        "options": {"chunk_tokens": options.chunk_tokens, "activation_checkpointing": options.activation_checkpointing,
                    "micro_batch_tokens": options.micro_batch_tokens, "dtype": options.dtype},
        "step_s": [round(t, 4) for t in times], "step_s_best": round(step_s, 4),
        "tokens_per_s": round(tokens / step_s, 1), "peak_memory_bytes": max(peaks[1:]),
        "peak_memory_gib": round(max(peaks[1:]) / 2**30, 2),
        "peak_memory_counts": "torch.cuda.max_memory_allocated over a timed step" if device.type == "cuda" else
        "tensors allocated during a timed step (bench/tensor_memory.py): weights and optimizer state excluded",
        "model_flops_per_step": flops, "loss": result.loss, "grad_norm": result.grad_norm,
        "engine_weights_s": round(engine_weights_s, 3), "engine_weights_dtype": str(next(iter(weights.values())).dtype),
    }
    peak = _bf16_peak(device)
    if peak is not None:
        out["mfu"] = round(flops / step_s / peak, 4)
        out["bf16_peak_flops"] = peak
    del trainer, model, weights
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def build_model(shape: dict[str, int], device: torch.device) -> torch.nn.Module:
    """A Qwen3 causal LM of `shape` with random weights, float32 (the trainer's master), on `device`."""
    import transformers

    config = transformers.Qwen3Config(**{k: v for k, v in qwen3_config(shape).items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.Qwen3ForCausalLM(config).float()


def bench_group(case: StepCase, prompt_tokens: int, vocab: int) -> Group:
    """One group of `case.rows` trajectories: a shared random prompt, then random generated
    tokens whose behaviour log-probs are a random model's (uniform), so TIS and IcePop keep them;
    rewards alternate 1, 0 so every row trains."""
    generator = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(0, vocab - 2, (prompt_tokens,), generator=generator).tolist()
    prompt = Prompt(id="bench", messages=({"role": "user", "content": "bench"},))
    generated = case.tokens - prompt_tokens
    trajectories = [
        Trajectory(id=index, group_id=0, index=index, attempt=0, prompt=prompt, start_version=0,
                   status=TrajectoryStatus.DONE,
                   token_ids=prompt_ids + torch.randint(0, vocab - 2, (generated,), generator=generator).tolist(),
                   generated_mask=[False] * prompt_tokens + [True] * generated,
                   logprobs=[0.0] * prompt_tokens + [-math.log(vocab)] * generated, reward=float(index % 2 == 0))
        for index in range(case.rows)]
    return Group(id=0, seq=0, prompt=prompt, trajectories=trajectories, admitted_at=0.0)


def model_flops(shape: dict[str, int], params: int, case: StepCase) -> float:
    """Forward + backward FLOPs of the model on the case's tokens: 6·params per token (the
    matmuls; the LM head's included) plus causal attention, 6·layers·L²·heads·head_dim a row of L
    tokens. Recomputation (activation checkpointing) and the prompt computed once are not
    counted: MFU is against the model's FLOPs, not the hardware's."""
    attention = 6 * shape["layers"] * case.tokens ** 2 * shape["heads"] * shape["head_dim"]
    return 6 * params * case.rows * case.tokens + case.rows * attention


@contextlib.contextmanager
def _peak_memory(device: torch.device) -> Iterator[dict[str, int]]:
    peak = {"bytes": 0}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield peak
        peak["bytes"] = torch.cuda.max_memory_allocated(device)
        return
    with TensorMemory() as memory:
        yield peak
    peak["bytes"] = memory.peak_bytes


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _bf16_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in BF16_PEAK_FLOPS.items() if key in name), None)


# --- weight push -------------------------------------------------------------------------

def _weight_push(options: BenchOptions) -> dict[str, Any] | None:
    """Each engine placement's push of the float32 master to engines in model.dtype
    (`bench/weight_push.py`: device copy, shared memory or CUDA IPC, broadcast, against the host
    copy and the socket); None with --push-repeats 0."""
    if options.push_repeats == 0:
        return None
    from venusrl.bench.weight_push import measure_weight_push

    return measure_weight_push(options.shape, options.device, options.dtype, trainer_dtype="float32",
                               repeats=options.push_repeats, progress=lambda line: print(line, file=sys.stderr))
