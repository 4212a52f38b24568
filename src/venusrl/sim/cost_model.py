"""Time of one engine iteration, in place of the forward pass.

One real forward step costs

    fixed_s + token_s * (prefill tokens + decode sequences) + kv_token_s * KV tokens read
            + attention_pair_s * sum over prefill chunks of (query, key) pairs
            + kv_token_s * sum over prefill chunks of the prefix they attend to
            + reload_token_s * tokens loaded from the host tier + reload_latency_s * loads

(a roofline summed term by term: the weight read and launch overhead are paid once per step,
the matmuls grow with the tokens computed, the attention of decode with the context read).
The last three terms are what long multi-turn contexts add to prefill:

- attention of prefill over its context: a chunk of C tokens starting at position P (its
  cached prefix) computes C*P + C*(C+1)/2 causal (query, key) pairs, each 4 * layers *
  query heads * head_dim FLOPs (QK^T and PV). Quadratic in context: at Qwen3-32B and a 64K
  context it is 2.1x the dense matmuls of the same tokens (`test_cost_model` checks this).
- the prefix read of chunked prefill: each chunk reads its prefix's KV from HBM once (a
  prompt split into n chunks reads it n times). The attention kernel's re-reads per query
  tile are not counted: at 128 queries a tile the kernel is compute-bound (~1,000 FLOPs per
  byte against the H100's ~300), so they hide under the pairs term.
- a reload from the host tier: its bytes over PCIe and a fixed latency per load.

Between two steps an engine hands over what the step sampled (`output_s` an output: building
each output, posting it to its stream, an engine process sending it on): the engine is not
stepping, and it is not a step's time either, so the fit of the steps cannot see it. The
validation fits it on the calibration run's engine time between steps (`bench/controller_terms.py`),
as it fits the time each call from the rollout side takes the engine's loop (`call_s`).

The simulator runs the scheduler on "units" of `quantum` real tokens (see `SimEngine`), so
one simulated iteration with any decode in it stands for `quantum` real decode steps.

Presets derive the coefficients from the GPU and model specs (`preset`); `fit` takes the
linear three from measured steps instead (the validation fits the tiny model on this CPU).
The fit keeps the prefill-attention and prefix-read terms at zero: the tiny model's contexts
(a few hundred tokens) make them too small to separate from `token_s` in measured steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from venusrl.engine.step_log import StepSample


@dataclass(slots=True, frozen=True)
class GpuSpec:
    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    flops: float  # dense bf16
    bandwidth_efficiency: float = 0.7
    flops_efficiency: float = 0.5  # MFU of prefill-sized matmuls
    step_overhead_s: float = 0.002  # launch, sampling, scheduler of one step
    kv_memory_fraction: float = 0.85  # of HBM, for weights + KV (SGLang mem_fraction_static)
    host_bytes_per_s: float = 25e9  # PCIe host-to-device, for KV reloaded from the host tier
    # One load from the host tier: the copy's launch and the scheduler's wait for it. Not
    # measured (no GPU here); an assumption the sensitivity table varies.
    host_load_latency_s: float = 1e-4


@dataclass(slots=True, frozen=True)
class ModelSpec:
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    q_heads: int
    bytes_per_value: int = 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers: QK^T and PV, 2 FLOPs a MAC each."""
        return 4 * self.layers * self.q_heads * self.head_dim


H100 = GpuSpec("H100-SXM", hbm_bytes=80e9, hbm_bytes_per_s=3.35e12, flops=989e12)
# Shapes from the models' config.json (num_hidden_layers, num_key_value_heads, head_dim,
# num_attention_heads).
QWEN3_4B = ModelSpec("Qwen3-4B", params=4.0e9, layers=36, kv_heads=8, head_dim=128, q_heads=32)
QWEN3_32B = ModelSpec("Qwen3-32B", params=32.8e9, layers=64, kv_heads=8, head_dim=128, q_heads=64)
MODELS = {"qwen3-4b": QWEN3_4B, "qwen3-32b": QWEN3_32B}


# The terms of an iteration's time, in the order `CostModel.iteration_terms` gives them: the
# weight read and launch of each step, the matmuls of the tokens computed, decode's KV read,
# prefill's attention pairs and prefix read, the host tier's copies and their latency.
ITERATION_TERMS = ("fixed", "compute", "kv_read", "prefill_attention", "prefix_read", "reload", "reload_latency")


@dataclass(slots=True, frozen=True)
class CostModel:
    fixed_s: float  # per forward step
    token_s: float  # per token computed (prefill token or decode sequence)
    kv_token_s: float  # per KV token read by decode attention
    reload_token_s: float  # per token reloaded from the host tier instead of recomputed
    kv_capacity_tokens: int  # device KV pool of one engine
    gpus: int = 1  # GPUs of one engine (tensor parallel degree)
    attention_pair_s: float = 0.0  # per (query, key) pair of prefill attention
    prefix_read_token_s: float = 0.0  # per prefix token a prefill chunk reads
    reload_latency_s: float = 0.0  # per load from the host tier
    # per output an engine hands over after a step (one a sampled sequence): the engine's time
    # between its steps, not a step's (`handover_seconds`)
    output_s: float = 0.0
    # per call from the rollout side (add, abort, priority, trajectory start and release,
    # demoted set, load, prefix export and import, weights): run on the engine's loop between
    # its steps, it delays the next one (`SimEngine._call`)
    call_s: float = 0.0

    def step_seconds(self, prefill_tokens: float, decode_seqs: float, kv_tokens: float) -> float:
        return self.fixed_s + self.token_s * (prefill_tokens + decode_seqs) + self.kv_token_s * kv_tokens

    def iteration_seconds(
        self, quantum: int, prefill_units: int, decode_contexts: list[int], reload_units: int,
        chunks: Sequence[tuple[int, int]] = (), loads: int = 0,
    ) -> float:
        """One simulated iteration: `prefill_units` computed, in `chunks` of (start position,
        length) in units; one unit generated for each decode sequence (context lengths in
        units at the start of the iteration); `reload_units` loaded from the host tier (not
        computed) in `loads` copies. The sum of `iteration_terms`."""
        return sum(self.iteration_terms(quantum, prefill_units, decode_contexts, reload_units, chunks, loads))

    def iteration_terms(
        self, quantum: int, prefill_units: int, decode_contexts: list[int], reload_units: int,
        chunks: Sequence[tuple[int, int]] = (), loads: int = 0,
    ) -> tuple[float, float, float, float, float, float, float]:
        """`iteration_seconds` term by term, named as ITERATION_TERMS (summed left to right,
        they give the iteration's seconds to the last bit, as the expression they replace)."""
        q = quantum
        decode = len(decode_contexts)
        steps = q if decode else 1
        kv_read = (sum(decode_contexts) * q + decode * q / 2) * q  # context grows during the q steps
        return (
            steps * self.fixed_s,
            self.token_s * (prefill_units * q + decode * q),
            self.kv_token_s * kv_read,
            self.attention_pair_s * sum(attention_pairs(start * q, length * q) for start, length in chunks),
            self.prefix_read_token_s * sum(start * q for start, _ in chunks),
            self.reload_token_s * reload_units * q,
            self.reload_latency_s * loads,
        )

    def handover_seconds(self, quantum: int, sampled: int) -> float:
        """The engine's time after a simulated iteration before it can start the next: handing
        over the outputs of `sampled` sequences, each producing `quantum` real tokens (one
        output a real step)."""
        return self.output_s * sampled * quantum


def attention_pairs(start: int, length: int) -> int:
    """Causal (query, key) pairs of a prefill chunk of `length` tokens at positions
    start..start+length-1: query i attends to the start + i + 1 keys up to itself."""
    return length * start + length * (length + 1) // 2


def preset(model: str, tp: int, gpu: GpuSpec = H100) -> CostModel:
    """Coefficients of `model` on `tp` GPUs of `gpu` from first principles: decode is bound by
    reading the weights and the KV, prefill by the matmul FLOPs."""
    spec = MODELS[model]
    bandwidth = tp * gpu.hbm_bytes_per_s * gpu.bandwidth_efficiency
    weights = spec.params * spec.bytes_per_value
    kv_pool_bytes = tp * gpu.hbm_bytes * gpu.kv_memory_fraction - weights
    if kv_pool_bytes <= 0:
        raise ValueError(f"{spec.name} does not fit on {tp} x {gpu.name}")
    flops = tp * gpu.flops * gpu.flops_efficiency
    return CostModel(
        fixed_s=gpu.step_overhead_s + weights / bandwidth,
        token_s=2 * spec.params / flops,
        kv_token_s=spec.kv_bytes_per_token / bandwidth,
        reload_token_s=spec.kv_bytes_per_token / (tp * gpu.host_bytes_per_s),
        kv_capacity_tokens=int(kv_pool_bytes // spec.kv_bytes_per_token),
        gpus=tp,
        attention_pair_s=spec.attention_flops_per_pair / flops,
        prefix_read_token_s=spec.kv_bytes_per_token / bandwidth,
        reload_latency_s=gpu.host_load_latency_s,
    )


# The terms `preset` adds to the linear roofline, by name (the sensitivity table's rows):
# each maps to the CostModel fields it sets.
EXTRA_TERMS = {
    "prefill_attention": ("attention_pair_s",),
    "prefix_reads": ("prefix_read_token_s",),
    "reload_latency": ("reload_latency_s",),
}


def without_terms(cost: CostModel, terms: Sequence[str]) -> CostModel:
    """`cost` with the named extra terms (keys of EXTRA_TERMS) set to zero."""
    unknown = set(terms) - set(EXTRA_TERMS)
    if unknown:
        raise ValueError(f"unknown cost terms {sorted(unknown)} (known: {', '.join(EXTRA_TERMS)})")
    return replace(cost, **{name: 0.0 for term in terms for name in EXTRA_TERMS[term]})


def fit(samples: list[StepSample], kv_capacity_tokens: int, reload_token_s: float = 0.0) -> CostModel:
    """Least-squares coefficients (each kept >= 0) from measured steps."""
    if len(samples) < 3:
        raise ValueError(f"fitting needs at least 3 measured steps, got {len(samples)}")
    x = np.array([[1.0, s.prefill_tokens + s.decode_seqs, s.kv_tokens] for s in samples])
    y = np.array([s.seconds for s in samples])
    active = [0, 1, 2]
    while True:  # drop negative coefficients and refit on the rest (tiny NNLS)
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (coef >= 0).all():
            break
        active = [a for a, c in zip(active, coef, strict=True) if c >= 0]
    full = dict.fromkeys(range(3), 0.0) | dict(zip(active, coef.tolist(), strict=True))
    return CostModel(full[0], full[1], full[2], reload_token_s, kv_capacity_tokens)
