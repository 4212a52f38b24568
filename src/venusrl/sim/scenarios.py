"""The named scenarios of `venusrl simulate` and the paper's figures they are compared with."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from venusrl.sim.cost_model import MODELS as MODEL_SHAPES
from venusrl.sim.run import SimSpec
from venusrl.sim.systems import system
from venusrl.sim.workload import WorkloadConfig, coarsened

MODELS = (("qwen3-4b", 1), ("qwen3-32b", 2))  # (model, tensor parallel degree of one engine)
FIG10_SYSTEMS = ("slime", "rollflash", "thunderagent", "venus")
TABLE1_SYSTEMS = ("baseline", "+priority", "+kv_residency", "+migration")

# The paper's figures (§6.2-6.3). Fig. 10 gives speedup ranges in its text; Table 1 exactly.
PAPER_FIG10 = {
    "venus_over_slime": (1.07, 3.26), "venus_over_rollflash": (1.06, 4.24),
    "venus_over_thunderagent": (1.05, 2.67),
    "async_1.0": {"qwen3-4b": (1.07, 1.15), "qwen3-32b": (1.05, 1.85)},
    "bsz16_async_1.5_2.0": (1.06, 1.17),
    "bsz32_64_async_1.5_2.0": {"qwen3-4b": (1.26, 1.71), "qwen3-32b": (1.64, 4.24)},
}  # fmt: skip
PAPER_TABLE1 = {16: (1.00, 1.01, 1.06, 1.10), 32: (1.00, 1.81, 2.72, 2.89), 64: (1.00, 1.42, 2.78, 3.26)}


@dataclass(slots=True, frozen=True)
class Fidelity:
    coarsen: float  # turns merged (see workload.coarsened)
    quantum: int
    steps: int


FULL = Fidelity(coarsen=4, quantum=128, steps=3)
# Throughput counts the steps after the first; one step is too few: a priority policy that
# finishes step 1 early leaves the hard groups to step 2 (venus 3,562 tok/s over step 2 alone,
# 3,738 over steps 2-6 on qwen3-32b, bsz 64).
QUICK = Fidelity(coarsen=8, quantum=256, steps=4)


@dataclass(slots=True, frozen=True)
class Case:
    """One cell of a scenario: a configuration run under several systems."""

    label: dict[str, object]
    specs: tuple[SimSpec, ...]


HOST_MEMORY_BYTES_PER_GPU = 1.8e12 / 8  # §6.1: nodes of 8 GPUs with 1.8 TB of host memory


def paper_cluster(model: str, tp: int) -> dict[str, object]:
    """The paper's settings (§6.1) where they differ from the training config's defaults, each
    with its reason; every other setting is the default a training run uses."""
    return {
        # "discarding samples whose generation spans three or more weight versions": the
        # coordinator discards a trajectory once version - start_version > max_version_span,
        # and three versions are a span of 2.
        "coordinator.max_version_span": 1,
        # "we enable the hierarchical cache (HiCache) in SGLang to support offloading KV Cache
        # to L2 host memory": every system's engine has a host tier, the host memory of its GPUs.
        "engine.host_kv_capacity_tokens": int(tp * HOST_MEMORY_BYTES_PER_GPU // MODEL_SHAPES[model].kv_bytes_per_token),
        # SGLang's prefill budgets on Hopper GPUs (the paper's engines), not the CPU-sized defaults.
        "engine.max_prefill_tokens": 16384,
        "engine.chunked_prefill_size": 8192,
    }


def _spec(name: str, fidelity: Fidelity, workload: WorkloadConfig, policy: str | None = None, *, model: str,
          tp: int, batch_groups: int, async_factor: float, **fields) -> SimSpec:
    settings = {**paper_cluster(model, tp), "coordinator.batch_groups": batch_groups,
                "coordinator.async_factor": async_factor}
    return SimSpec(system(name, policy, settings), workload=coarsened(workload, fidelity.coarsen), model=model, tp=tp,
                   quantum=fidelity.quantum, steps=fidelity.steps, **fields)


def fig10(quick: bool, workload: WorkloadConfig, extra_policy: str | None = None) -> Iterator[Case]:
    """Batch 16/32/64 x async_factor 1.0/1.5/2.0 x 4B/32B on 16 generation GPUs (quick: batch
    16 and 64 at async_factor 1.5)."""
    fidelity = QUICK if quick else FULL
    batches, factors = ((16, 64), (1.5,)) if quick else ((16, 32, 64), (1.0, 1.5, 2.0))
    for model, tp in MODELS:
        for factor in factors:
            for batch in batches:
                fields = {"model": model, "tp": tp, "batch_groups": batch, "async_factor": factor}
                specs = [_spec(s, fidelity, workload, **fields) for s in FIG10_SYSTEMS]
                if extra_policy:
                    specs.append(_spec("venus", fidelity, workload, extra_policy, **fields))
                yield Case({"model": model, "batch": batch, "async_factor": factor}, tuple(specs))


def table1(quick: bool, workload: WorkloadConfig, extra_policy: str | None = None) -> Iterator[Case]:
    """Qwen3-32B, async_factor 1.5, batch 16/32/64: the cumulative ablation."""
    fidelity = QUICK if quick else FULL
    for batch in (16, 32, 64):
        fields = {"model": "qwen3-32b", "tp": 2, "batch_groups": batch, "async_factor": 1.5}
        specs = [_spec(s, fidelity, workload, **fields) for s in TABLE1_SYSTEMS]
        if extra_policy:
            specs.append(_spec("+migration", fidelity, workload, extra_policy, **fields))
        yield Case({"model": "qwen3-32b", "batch": batch, "async_factor": 1.5}, tuple(specs))


def scale(quick: bool, workload: WorkloadConfig, extra_policy: str | None = None) -> Iterator[Case]:
    """1,000 GPUs (Qwen3-4B, one engine per GPU), 100,000 trajectories in flight (B = 6,250,
    async_factor 2.0), for the first simulated minutes (quick: 100 GPUs, 10,000)."""
    gpus = 100 if quick else 1000
    batch = gpus * 100 // (8 * 2)
    spec = _spec("venus", FULL, workload, model="qwen3-4b", tp=1, generation_gpus=gpus, train_gpus=gpus,
                 batch_groups=batch, async_factor=2.0)
    spec = replace(spec, workload=coarsened(workload, 8), quantum=256, max_sim_seconds=30.0 if quick else 60.0)
    yield Case({"gpus": gpus, "trajectories_in_flight": batch * 2 * 8}, (spec,))


SCENARIOS = {"paper-fig10": fig10, "paper-table1": table1, "scale": scale}
