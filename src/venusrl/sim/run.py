"""Build one simulated cluster (engines, worker, coordinator, trainer) and run it."""

from __future__ import annotations

import functools
import itertools
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from venusrl.config import Config
from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.policies import make_rule
from venusrl.engine.radix_cache import Tier
from venusrl.sim.cost_model import ITERATION_TERMS, MODELS, CostModel, preset
from venusrl.sim.engine import SimEngine
from venusrl.sim.events import EventLoop
from venusrl.sim.predictor import NoisyLengthPredictor, log_spread
from venusrl.sim.systems import SystemSpec
from venusrl.sim.trainer import SimTrainer, TrainerCost, trainer_preset
from venusrl.sim.worker import SimWorker
from venusrl.sim.workload import Workload, WorkloadConfig
from venusrl.types import Group, Priority, Prompt, Trajectory

log = logging.getLogger(__name__)

# A run is deterministic, but the order of events that fall close together decides ties (which
# turn asks first, where it goes):
# delivering outputs one microsecond later moved venus's time to the last step by up to 7% on
# one seed of Fig. 10's quick cells, medians over seeds unmoved (results/sim-thunderagent/
# cell-anatomy/README.md, "How far a seed moves under a microsecond"). A perturbation
# (`SimSpec.perturbation`) delays each delivery by a draw of [0, PERTURBATION_S): a millisecond
# reorders the events of different engines that fall within it (an engine iteration of the quick
# cells simulates 32 tokens a sequence in 0.3-0.9 s) and adds 500 us a turn on average (16 ms to
# a trajectory of Fig. 10's 33 turns, in runs of thousands of seconds). Draws
# below a microsecond changed nothing at 4B batch 16: what moved those seeds was the delivery
# leaving the engine's event (what the worker does with it then runs after that event, not
# inside it), not the order of deliveries.
PERTURBATION_S = 1e-3


# The share of the predictor's log error that is the trajectory's, the same at each of its
# queries (`NoisyLengthPredictor.trajectory_share`; 0: fresh noise at every query). Fitted on the
# calibration runs of the validation's two recordings: at 0.9 the simulated venus rounds send
# their engines as many priorities as the real worker did (`set_priority` calls logged by the
# engines), where fresh noise sends 17-63% more (results/sim-machine-speed/README.md).
PREDICTOR_TRAJECTORY_SHARE = 0.9


@dataclass(slots=True)
class SimSpec:
    """One simulated run. The cluster's settings that the training config has (B, K's window,
    the staleness bound, slots, engine limits, what a weight update does to cached KV) are
    `system.config`, the training config with the system's preset and the cell's settings
    applied (`systems.system`); the fields here are what only a simulation has."""

    system: SystemSpec
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    model: str = "qwen3-4b"
    tp: int = 1
    generation_gpus: int = 16
    train_gpus: int = 16
    steps: int = 4  # optimizer steps to run
    measure_from: int = 1  # throughput counts steps after this one (warm-up excluded)
    quantum: int = 64  # real tokens per simulated unit
    predictor_spearman: float = 0.98  # the paper's Fig. 16a
    predictor_trajectory_share: float = PREDICTOR_TRAJECTORY_SHARE
    prediction_latency_s: float = 0.05
    weight_sync_s: float = 1.0
    network_bytes_per_s: float = 25e9  # host-to-host KV copy for migration
    # a move's time beyond its KV bytes: the calls that start it on the target, copy its prefix
    # and release it on the source (the validation sets the mean the bench measured)
    move_latency_s: float = 0.0
    # the rollout side's round trips to its engines (the validation sets what the bench measured):
    # a finished request's output from the engine to the worker, and a turn's ask for its engine's
    # demoted set (made before it asks for a slot where the core wants it)
    delivery_latency_s: float = 0.0
    demoted_query_s: float = 0.0
    seed: int = 0
    # k > 0: every finished request's output reaches the worker a further uniform draw of
    # [0, PERTURBATION_S) later, from a stream of its own (seed, k): the same workload and costs,
    # another order of the events that fall close together
    perturbation: int = 0
    cost: CostModel | None = None  # None: the preset of `model` at `tp`
    trainer: TrainerCost | None = None
    max_sim_seconds: float = float("inf")
    max_events: int | None = None
    tool_seconds_prior: float | None = None  # None: the workload's median

    @property
    def config(self) -> Config:
        return self.system.config


@dataclass(slots=True)
class SimResult:
    name: str
    sim_seconds: float
    steps: int
    step_times: list[float]
    throughput_tokens_per_s: float
    time_to_first_batch_s: float | None
    # (group id, admitted at, ready at) of each group handed to the trainer, in the order it
    # takes them (B a step): a step ends after its last group's gradients and the optimizer
    # step. Every system admits the dataset in one order, so a group id is one prompt in all.
    groups_ready: list[tuple[int, float, float]]
    wall_s: float
    events: int
    engine: dict[str, Any]
    worker: dict[str, Any]
    coordinator: dict[str, int]

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "sim_seconds": round(self.sim_seconds, 3), "steps": self.steps,
            "step_times": [round(t, 3) for t in self.step_times],
            "throughput_tokens_per_s": round(self.throughput_tokens_per_s, 1),
            "time_to_first_batch_s": None if self.time_to_first_batch_s is None else round(self.time_to_first_batch_s, 3),
            "wall_s": round(self.wall_s, 2), "events": self.events, "events_per_s": round(self.events_per_s),
            "engine": self.engine, "worker": self.worker, "coordinator": self.coordinator,
            "groups_ready": [[group, round(admitted, 3), round(ready, 3)] for group, admitted, ready in self.groups_ready],
        }  # fmt: skip


def prompts() -> Iterator[Prompt]:
    """An endless dataset; the workload draws each prompt's trajectories from its index."""
    for index in itertools.count():
        yield Prompt(id=str(index), messages=({"role": "user", "content": ""},), metadata={"index": index})


def simulate(spec: SimSpec, progress: Callable[[float, int], None] | None = None) -> SimResult:
    """Run until `spec.steps` optimizer steps (or the time or event limit)."""
    started = time.perf_counter()
    q = spec.quantum
    workload = Workload(spec.workload, spec.seed)
    cost = spec.cost or preset(spec.model, spec.tp)
    loop = EventLoop()
    token_ids = itertools.count()
    settings = spec.config
    # The training config's engine in simulated units: one unit a page, the pool the cost
    # model's, the host tier the config's (the scheduler's own, its loads priced by SimEngine).
    engine_config = settings.engine.model_copy(update={
        "page_size": 1, "kv_capacity_tokens": cost.kv_capacity_tokens // q,
        "host_kv_capacity_tokens": settings.engine.host_kv_capacity_tokens // q,
        "max_prefill_tokens": max(1, settings.engine.max_prefill_tokens // q),
        "chunked_prefill_size": max(1, settings.engine.chunked_prefill_size // q)})
    engines = [
        SimEngine(i, loop, engine_config, cost, q, token_ids, on_finished=lambda *_: None,
                  weight_sync_s=spec.weight_sync_s)
        for i in range(spec.generation_gpus // cost.gpus)
    ]  # fmt: skip
    sample = [workload.plan(p, i, 0) for p in range(64) for i in range(workload.group_size)]
    mean_units = sum(p.gen_tokens for p in sample) / len(sample) / q
    mean_turn_units = mean_units * len(sample) / sum(len(p.turns) for p in sample)
    tool_prior = spec.tool_seconds_prior if spec.tool_seconds_prior is not None else spec.workload.tool_seconds_median
    slots_per_engine = settings.scheduler.slots_per_engine
    # The training config's coordinator; K is the workload's, the priors its means in units.
    config = settings.coordinator.model_copy(update={
        "group_size": workload.group_size, "prior_remaining_tokens": mean_units, "prior_tokens_per_turn": mean_turn_units,
        "prior_seconds_per_token": cost.iteration_seconds(q, 0, [mean_units] * slots_per_engine, 0),
        "prior_tool_seconds": max(0.0, tool_prior)})
    worker_ref: list[SimWorker] = []

    def true_remaining(trajectory: Trajectory) -> float:
        live = worker_ref[0].live.get(trajectory.id)
        return live.remaining_units if live is not None else 0.0

    rule = make_rule(config.policy, true_remaining=true_remaining) if config.policy == "oracle" else None
    coordinator = DataCoordinator(config, prompts(), rule=rule)
    groups_ready: list[tuple[int, float, float]] = []

    def on_step(version: int) -> None:
        log.info("weight version %d at %.1fs simulated", version, loop.now)
        worker._apply(coordinator.on_weight_version(version, loop.now))
        for engine in engines:
            engine.update_weights(version)
        if version >= spec.steps:
            loop.stop()

    trainer = SimTrainer(loop, spec.trainer or trainer_preset(spec.model, spec.train_gpus), config.batch_groups, on_step)

    def on_ready(group: Group) -> None:
        groups_ready.append((group.id, group.admitted_at, loop.now))
        trainer.add_group(q * sum(len(t.token_ids) for t in group.trajectories))

    group_prompts: dict[int, list[int]] = {}
    shared_ids: list[int] = []  # the prefix every prompt shares, as long as the longest sharer needs

    def prompt_ids_of(trajectory: Trajectory) -> list[int]:
        index = trajectory.prompt.metadata["index"]
        if index not in group_prompts:
            tokens, shared_tokens = workload.prompt_tokens(index)
            units, shared = max(1, round(tokens / q)), round(shared_tokens / q)
            shared_ids.extend(next(token_ids) for _ in range(shared - len(shared_ids)))
            group_prompts[index] = shared_ids[:shared] + [next(token_ids) for _ in range(units - shared)]
        return group_prompts[index]

    predictor = None
    if spec.system.uses_predictions:
        spread = log_spread([p.gen_tokens // q for p in sample])
        predictor = NoisyLengthPredictor(spec.predictor_spearman, spread, spec.prediction_latency_s, spec.seed,
                                         spec.predictor_trajectory_share)
    kv_bytes = MODELS[spec.model].kv_bytes_per_token if spec.model in MODELS else 0
    jitter = None
    if spec.perturbation:
        jitter = functools.partial(random.Random(f"perturbation {spec.seed} {spec.perturbation}").uniform,
                                   0.0, PERTURBATION_S)
    worker = SimWorker(
        loop, coordinator, engines, spec.system, slots_per_engine,
        plan_of=lambda t: workload.plan(t.prompt.metadata["index"], t.index, t.attempt),
        prompt_ids_of=prompt_ids_of, token_ids=token_ids, quantum=q, on_ready=on_ready,
        predictor=predictor, transfer_s_per_unit=q * kv_bytes / spec.network_bytes_per_s,
        move_latency_s=spec.move_latency_s, delivery_latency_s=spec.delivery_latency_s, delivery_jitter=jitter,
        demoted_query_s=spec.demoted_query_s,
    )  # fmt: skip
    worker_ref.append(worker)
    worker.start()
    chunk = 20000
    while loop.pending and trainer.version < spec.steps and loop.now < spec.max_sim_seconds:
        if spec.max_events is not None and loop.processed >= spec.max_events:
            break
        before = loop.processed
        loop.run(until=spec.max_sim_seconds, max_events=chunk)
        if progress is not None:
            progress(loop.now, loop.processed)
        if loop.processed == before:
            break
    return _result(spec, loop, engines, worker, coordinator, trainer, groups_ready, time.perf_counter() - started)


def _result(spec: SimSpec, loop: EventLoop, engines: list[SimEngine], worker: SimWorker,
            coordinator: DataCoordinator, trainer: SimTrainer, groups_ready: list[tuple[int, float, float]], wall_s: float) -> SimResult:
    q = spec.quantum
    batch = coordinator.config.batch_groups
    steps = trainer.step_times
    k = spec.measure_from
    if len(steps) > k:
        start = steps[k - 1] if k > 0 else 0.0
        throughput = sum(trainer.step_tokens[k:]) / max(1e-9, steps[-1] - start)
    else:
        throughput = sum(trainer.step_tokens) / loop.now if loop.now else 0.0
    counters = [e.scheduler.counters for e in engines]
    prompt = sum(c.prompt_tokens for c in counters)
    # The scheduler counts a token loaded back from its host tier as a hit, not as recomputed.
    reloaded = sum(e.totals.reload_units for e in engines)
    engine = {
        "engines": len(engines),
        "busy_fraction": round(sum(e.totals.busy_s for e in engines) / max(1e-9, loop.now * len(engines)), 4),
        # where the engines' busy time went, summed over engines: the cost model's terms and
        # the stalls of weight updates
        "busy_s_by_term": {name: round(sum(e.totals.term_s[i] for e in engines), 1)
                           for i, name in enumerate(ITERATION_TERMS)}
                          | {"weight_sync": round(sum(e.totals.weight_sync_s for e in engines), 1)},
        "hit_rate": round(sum(c.cached_tokens for c in counters) / prompt, 4) if prompt else 0.0,
        "recomputed_tokens": q * sum(c.recomputed_tokens for c in counters),
        "reloaded_tokens": q * reloaded,
        "dropped_at_weight_update_tokens": q * sum(c.dropped_at_weight_update_tokens for c in counters),
        "evicted_tokens": {tier.name.lower(): q * sum(e.scheduler.cache.evicted_tokens[tier] for e in engines)
                           for tier in Tier},
        "prefill_tokens": q * sum(e.totals.prefill_units for e in engines),
        "decode_tokens": q * sum(e.totals.decode_units for e in engines),
        "retractions": sum(c.retractions for c in counters),
        # iterations whose admission stopped for memory, by the priority of the request it stopped at
        "memory_stalls": {p.name.lower(): sum(c.memory_stalls_by_priority[p] for c in counters) for p in Priority},
        "engine_preemptions": sum(c.preemptions for c in counters),
        "demotions": sum(c.demotions for c in counters),
        "iterations": sum(e.totals.iterations for e in engines),
    }
    worker_counts = asdict(worker.counts)
    worker_counts.update(worker.move_figures())  # moves decided, by reason; readings with room
    return SimResult(
        name=spec.system.name, sim_seconds=loop.now, steps=trainer.version, step_times=list(steps),
        throughput_tokens_per_s=throughput, wall_s=wall_s, events=loop.processed, engine=engine, worker=worker_counts,
        time_to_first_batch_s=groups_ready[batch - 1][2] if len(groups_ready) >= batch else None,
        coordinator=asdict(coordinator.counts), groups_ready=groups_ready,
    )  # fmt: skip
