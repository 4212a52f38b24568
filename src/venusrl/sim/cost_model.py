"""Time of one engine iteration, in place of the forward pass.

One real forward step costs

    fixed_s + token_s * (prefill tokens + decode sequences) + kv_token_s * KV tokens read

(a linear roofline: the weight read and launch overhead are paid once per step, the matmuls
grow with the tokens computed, the attention of decode with the context read). The simulator
runs the scheduler on "units" of `quantum` real tokens (see `SimEngine`), so one simulated
iteration with any decode in it stands for `quantum` real decode steps.

Presets derive the three coefficients from the GPU and model specs (`preset`); `fit` takes
them from measured steps instead (the validation fits the tiny model on this CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(slots=True, frozen=True)
class ModelSpec:
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_value: int = 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value


H100 = GpuSpec("H100-SXM", hbm_bytes=80e9, hbm_bytes_per_s=3.35e12, flops=989e12)
QWEN3_4B = ModelSpec("Qwen3-4B", params=4.0e9, layers=36, kv_heads=8, head_dim=128)
QWEN3_32B = ModelSpec("Qwen3-32B", params=32.8e9, layers=64, kv_heads=8, head_dim=128)
MODELS = {"qwen3-4b": QWEN3_4B, "qwen3-32b": QWEN3_32B}


@dataclass(slots=True, frozen=True)
class CostModel:
    fixed_s: float  # per forward step
    token_s: float  # per token computed (prefill token or decode sequence)
    kv_token_s: float  # per KV token read by decode attention
    reload_token_s: float  # per token reloaded from the host tier instead of recomputed
    kv_capacity_tokens: int  # device KV pool of one engine
    gpus: int = 1  # GPUs of one engine (tensor parallel degree)

    def step_seconds(self, prefill_tokens: float, decode_seqs: float, kv_tokens: float) -> float:
        return self.fixed_s + self.token_s * (prefill_tokens + decode_seqs) + self.kv_token_s * kv_tokens

    def iteration_seconds(
        self, quantum: int, prefill_units: int, decode_contexts: list[int], reload_units: int
    ) -> float:
        """One simulated iteration: `prefill_units` computed, one unit generated for each
        decode sequence (context lengths in units at the start of the iteration), and
        `reload_units` of prefill served from the host tier instead of computed."""
        q = quantum
        decode = len(decode_contexts)
        steps = q if decode else 1
        kv_read = (sum(decode_contexts) * q + decode * q / 2) * q  # context grows during the q steps
        computed = (prefill_units - reload_units) * q
        return (
            steps * self.fixed_s
            + self.token_s * (computed + decode * q)
            + self.kv_token_s * kv_read
            + self.reload_token_s * reload_units * q
        )


def preset(model: str, tp: int, gpu: GpuSpec = H100) -> CostModel:
    """Coefficients of `model` on `tp` GPUs of `gpu` from first principles: decode is bound by
    reading the weights and the KV, prefill by the matmul FLOPs."""
    spec = MODELS[model]
    bandwidth = tp * gpu.hbm_bytes_per_s * gpu.bandwidth_efficiency
    weights = spec.params * spec.bytes_per_value
    kv_pool_bytes = tp * gpu.hbm_bytes * gpu.kv_memory_fraction - weights
    if kv_pool_bytes <= 0:
        raise ValueError(f"{spec.name} does not fit on {tp} x {gpu.name}")
    return CostModel(
        fixed_s=gpu.step_overhead_s + weights / bandwidth,
        token_s=2 * spec.params / (tp * gpu.flops * gpu.flops_efficiency),
        kv_token_s=spec.kv_bytes_per_token / bandwidth,
        reload_token_s=spec.kv_bytes_per_token / (tp * gpu.host_bytes_per_s),
        kv_capacity_tokens=int(kv_pool_bytes // spec.kv_bytes_per_token),
        gpus=tp,
    )


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
