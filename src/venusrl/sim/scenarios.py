"""The named scenarios of `venusrl simulate` and the paper's figures they are compared with."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from venusrl.sim.cost_model import EXTRA_TERMS, preset, without_terms
from venusrl.sim.cost_model import MODELS as MODEL_SHAPES
from venusrl.sim.run import SimSpec
from venusrl.sim.systems import system
from venusrl.sim.workload import WorkloadConfig, coarsened

MODELS = (("qwen3-4b", 1), ("qwen3-32b", 2))  # (model, tensor parallel degree of one engine)
FIG10_SYSTEMS = ("slime", "rollflash", "thunderagent", "venus")
TABLE1_SYSTEMS = ("baseline", "+priority", "+kv_residency", "+migration", "+live_set", "+decode_balance")

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


# Turns are not merged (coarsening 1): every merged turn boundary is a tool pause a
# program-aware scheduler exploits, so coarsened runs overstate venus against ThunderAgent
# (0.95x at 8 merged turns, 0.54x at none, before the live set: `results/sim-coarsening/`).
FULL = Fidelity(coarsen=1, quantum=32, steps=4)
# Throughput counts the steps after the first; one step is too few: a priority policy that
# finishes step 1 early leaves the hard groups to step 2 (venus 3,562 tok/s over step 2 alone,
# 3,738 over steps 2-6 on qwen3-32b, bsz 64).
QUICK = Fidelity(coarsen=1, quantum=32, steps=4)
# The coarser fidelity the scenarios ran before (8 merged turns): the sensitivity rows' default.
COARSE = Fidelity(coarsen=8, quantum=256, steps=4)


@dataclass(slots=True, frozen=True)
class Case:
    """One cell of a scenario: a configuration run under several systems."""

    label: dict[str, object]
    specs: tuple[SimSpec, ...]


# §6.1: "Each node is equipped with eight NVIDIA Hopper GPUs ... and 1.8 TB of host memory".
HOST_MEMORY_BYTES_PER_GPU = 1.8e12 / 8
# SGLang's HiCache host pool when only --enable-hierarchical-cache is given: hicache_ratio
# (host pool / device pool) defaults to 2.0 (sglang server_args.py; its HiCache best-practice
# guide: "--hicache-ratio 2  # Host memory ratio (2x GPU memory)"). The paper enables HiCache
# and gives no size, so its engines ran the default. The node's memory would allow 6.4x at
# Qwen3-32B on 2 GPUs (`host_ratio=None` below; the sensitivity table sweeps the ratio).
HICACHE_RATIO = 2.0
# Fig. 1a: "the configured generation batch size of each rollout worker is 64": a rollout
# worker is one engine (the figure plots its active batch), so 64 turns generate at once per
# engine (the training default, 16, is sized for this CPU machine).
PAPER_SLOTS_PER_ENGINE = 64


def host_tier_tokens(model: str, tp: int, host_ratio: float | None) -> int:
    """Host-tier KV of one engine: `host_ratio` times its device pool (HiCache's ratio), or,
    with None, all the host memory of its GPUs (§6.1's 1.8 TB per 8-GPU node)."""
    if host_ratio is None:
        return int(tp * HOST_MEMORY_BYTES_PER_GPU // MODEL_SHAPES[model].kv_bytes_per_token)
    return int(host_ratio * preset(model, tp).kv_capacity_tokens)


def paper_cluster(model: str, tp: int, host_ratio: float | None = HICACHE_RATIO,
                  slots_per_engine: int = PAPER_SLOTS_PER_ENGINE) -> dict[str, object]:
    """The paper's settings (§6.1) where they differ from the training config's defaults, each
    with its source; every other setting is the default a training run uses. Where the paper
    is silent:
    - TP: Qwen3-4B on 1 GPU, Qwen3-32B on 2 (`MODELS`): the fewest 80 GB Hopper GPUs its
      bf16 weights (65.6 GB) and a KV pool fit on; 16 generation GPUs are 16 or 8 engines.
    - KV capacity per engine: SGLang's mem_fraction_static 0.85 of HBM less the weights
      (`cost_model.preset`): 1.17M tokens (4B, 1 GPU), 268K tokens (32B, 2 GPUs).
    - context and turns: the workload's 128K-token cap and 300 turns are §6.1's ("maximum
      output length to 128K tokens ... at most 300 turns"), K = 8 ("eight samples per prompt").
    - tool latencies: §6.1 and Fig. 1 give none; Fig. 16b's axis bounds the mean tool call at
      about 1.2 s. The workload keeps its SWE-agent-like median of 3 s (mean 4.9 s, so tools
      take longer than the paper's); the sensitivity table's `tool_latency_fig16b` row runs
      a mean of 1 s."""
    return {
        # "discarding samples whose generation spans three or more weight versions": the
        # coordinator discards a trajectory once version - start_version > max_version_span,
        # and three versions are a span of 2.
        "coordinator.max_version_span": 1,
        # "we enable the hierarchical cache (HiCache) in SGLang to support offloading KV Cache
        # to L2 host memory": every system's engine has a host tier, HiCache's default size.
        "engine.host_kv_capacity_tokens": host_tier_tokens(model, tp, host_ratio),
        "scheduler.slots_per_engine": slots_per_engine,
        "engine.max_running_requests": max(64, slots_per_engine),
        # SGLang's prefill budgets on Hopper GPUs (the paper's engines), not the CPU-sized defaults.
        "engine.max_prefill_tokens": 16384,
        "engine.chunked_prefill_size": 8192,
    }


def _spec(name: str, fidelity: Fidelity, workload: WorkloadConfig, policy: str | None = None, *, model: str,
          tp: int, batch_groups: int, async_factor: float, cluster: dict[str, object] | None = None,
          **fields) -> SimSpec:
    settings = {**(cluster if cluster is not None else paper_cluster(model, tp)), "coordinator.batch_groups": batch_groups,
                "coordinator.async_factor": async_factor}
    return SimSpec(system(name, policy, settings), workload=coarsened(workload, fidelity.coarsen), model=model, tp=tp,
                   quantum=fidelity.quantum, steps=fidelity.steps, **fields)


def fig10_cell(name: str, model: str, batch: int, *, async_factor: float = 1.5, quick: bool = True,
               workload: WorkloadConfig | None = None, policy: str | None = None,
               settings: dict[str, object] | None = None, **fields) -> SimSpec:
    """System `name` in one cell of Fig. 10, as `venusrl simulate --scenario paper-fig10`
    runs it (`quick`: its --quick fidelity); `settings`: training-config keys (dotted) over the
    paper's cluster; `fields`: SimSpec's own (seed, generation_gpus, ...). The table and the
    scripts that study one of its cells build the cell here."""
    tp = dict(MODELS)[model]
    cluster = {**paper_cluster(model, tp), **(settings or {})}
    return _spec(name, QUICK if quick else FULL, workload or WorkloadConfig(), policy, model=model, tp=tp,
                 batch_groups=batch, async_factor=async_factor, cluster=cluster, **fields)


def fig10(quick: bool, workload: WorkloadConfig, extra_policy: str | None = None) -> Iterator[Case]:
    """Batch 16/32/64 x async_factor 1.0/1.5/2.0 x 4B/32B on 16 generation GPUs (quick: batch
    16 and 64 at async_factor 1.5)."""
    batches, factors = ((16, 64), (1.5,)) if quick else ((16, 32, 64), (1.0, 1.5, 2.0))
    for model, _ in MODELS:
        for factor in factors:
            for batch in batches:
                cell = {"model": model, "batch": batch, "async_factor": factor, "quick": quick, "workload": workload}
                specs = [fig10_cell(s, **cell) for s in FIG10_SYSTEMS]
                if extra_policy:
                    specs.append(fig10_cell("venus", **cell, policy=extra_policy))
                yield Case({"model": model, "batch": batch, "async_factor": factor,
                            "coarsening": (QUICK if quick else FULL).coarsen}, tuple(specs))


def table1(quick: bool, workload: WorkloadConfig, extra_policy: str | None = None) -> Iterator[Case]:
    """Qwen3-32B, async_factor 1.5, batch 16/32/64: the cumulative ablation."""
    fidelity = QUICK if quick else FULL
    for batch in (16, 32, 64):
        fields = {"model": "qwen3-32b", "tp": 2, "batch_groups": batch, "async_factor": 1.5}
        specs = [_spec(s, fidelity, workload, **fields) for s in TABLE1_SYSTEMS]
        if extra_policy:
            specs.append(_spec("+migration", fidelity, workload, extra_policy, **fields))
        yield Case({"model": "qwen3-32b", "batch": batch, "async_factor": 1.5, "coarsening": fidelity.coarsen},
                   tuple(specs))


def scale(quick: bool, workload: WorkloadConfig, extra_policy: str | None = None) -> Iterator[Case]:
    """1,000 GPUs (Qwen3-4B, one engine per GPU), 100,000 trajectories in flight (B = 6,250,
    async_factor 2.0), for the first simulated minutes (quick: 100 GPUs, 10,000)."""
    gpus = 100 if quick else 1000
    batch = gpus * 100 // (8 * 2)
    spec = _spec("venus", FULL, workload, model="qwen3-4b", tp=1, generation_gpus=gpus, train_gpus=gpus,
                 batch_groups=batch, async_factor=2.0)
    spec = replace(spec, workload=coarsened(workload, 8), quantum=256, max_sim_seconds=30.0 if quick else 60.0)
    yield Case({"gpus": gpus, "trajectories_in_flight": batch * 2 * 8}, (spec,))


@dataclass(slots=True, frozen=True)
class Variant:
    """One row of the sensitivity table: the model's terms and the cluster's settings."""

    terms: tuple[str, ...] = ()  # the cost model's extra terms kept (EXTRA_TERMS' keys)
    host_ratio: float | None = None  # None: the node's host memory (the previous model's tier)
    slots_per_engine: int = 16  # the training default the previous scenarios ran
    kv_after_weight_update: str = "recompute"
    tool_seconds_median: float | None = None  # None: the workload's
    fidelity: Fidelity = COARSE


ALL_TERMS = tuple(EXTRA_TERMS)
# The previous scenarios' model (linear roofline, the node's host memory, 16 slots), each
# term added alone, then together, then the paper's setting on top, then the checks.
_BEFORE = Variant()
_TERMS = Variant(terms=ALL_TERMS, host_ratio=HICACHE_RATIO)
_PAPER = replace(_TERMS, slots_per_engine=PAPER_SLOTS_PER_ENGINE)
SENSITIVITY = {
    "before": _BEFORE,
    "+prefill_attention": replace(_BEFORE, terms=("prefill_attention",)),
    "+prefix_reads": replace(_BEFORE, terms=("prefix_reads",)),
    "+reload_latency": replace(_BEFORE, terms=("reload_latency",)),
    "+host_tier_hicache_2x": replace(_BEFORE, host_ratio=HICACHE_RATIO),
    "+host_tier_1x": replace(_BEFORE, host_ratio=1.0),
    "+host_tier_none": replace(_BEFORE, host_ratio=0.0),
    "+kv_kept_at_weight_update": replace(_BEFORE, kv_after_weight_update="keep"),
    "+slots_64": replace(_BEFORE, slots_per_engine=PAPER_SLOTS_PER_ENGINE),
    "all_cost_terms": _TERMS,
    "all_cost_terms+slots_64": _PAPER,
    "all_cost_terms+slots_64+host_tier_1x": replace(_PAPER, host_ratio=1.0),
    "all_cost_terms+slots_64+tool_latency_fig16b": replace(_PAPER, tool_seconds_median=0.6),  # mean 0.6 e^0.5 = 1.0 s
    "all_cost_terms+slots_64+coarsen_4": replace(_PAPER, fidelity=Fidelity(coarsen=4, quantum=128, steps=4)),
}


def sensitivity(quick: bool, workload: WorkloadConfig, extra_policy: str | None = None) -> Iterator[Case]:
    """Fig. 10's Qwen3-32B, batch 64, async_factor 1.5 cell under each row of SENSITIVITY
    (quick: the rows up to `all_cost_terms+slots_64`, without the coarsening check)."""
    rows = list(SENSITIVITY.items())
    if quick:
        rows = rows[: list(SENSITIVITY).index("all_cost_terms+slots_64") + 1]
    yield from _cell_under(rows, workload, extra_policy)


# Turns merged by 8, 4 and 2, and not merged (1), each at a quantum that keeps a turn a few
# units long, the scenarios' model and setting otherwise: does coarsening move the figures?
COARSENING = {f"coarsen_{f.coarsen:g}": replace(_PAPER, fidelity=f)
              for f in (COARSE, Fidelity(coarsen=4, quantum=128, steps=4), Fidelity(coarsen=2, quantum=64, steps=4),
                        Fidelity(coarsen=1, quantum=32, steps=4))}


def coarsening(quick: bool, workload: WorkloadConfig, extra_policy: str | None = None) -> Iterator[Case]:
    """The sensitivity cell with all cost terms and 64 slots at coarsening 8, 4, 2 and 1
    (quick: 8 and 4)."""
    rows = list(COARSENING.items())
    yield from _cell_under(rows[:2] if quick else rows, workload, extra_policy)


def _cell_under(rows: list[tuple[str, Variant]], workload: WorkloadConfig, extra_policy: str | None) -> Iterator[Case]:
    model, tp = "qwen3-32b", 2
    for label, row in rows:
        cluster = paper_cluster(model, tp, row.host_ratio, row.slots_per_engine)
        cluster["engine.kv_after_weight_update"] = row.kv_after_weight_update
        cost = without_terms(preset(model, tp), [t for t in ALL_TERMS if t not in row.terms])
        load = workload if row.tool_seconds_median is None else workload.model_copy(
            update={"tool_seconds_median": row.tool_seconds_median})
        fields = {"model": model, "tp": tp, "batch_groups": 64, "async_factor": 1.5, "cluster": cluster, "cost": cost}
        names = [*FIG10_SYSTEMS, *(["venus"] if extra_policy else [])]
        policies = [None] * len(FIG10_SYSTEMS) + ([extra_policy] if extra_policy else [])
        specs = [_spec(n, row.fidelity, load, p, **fields) for n, p in zip(names, policies, strict=True)]
        yield Case({"variant": label, "coarsening": row.fidelity.coarsen}, tuple(specs))


SCENARIOS = {"paper-fig10": fig10, "paper-table1": table1, "scale": scale, "sensitivity": sensitivity,
             "coarsening": coarsening}
