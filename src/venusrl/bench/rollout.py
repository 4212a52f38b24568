"""`venusrl bench rollout`: how long N training steps take with the trainer in the loop,
for trajectory-level slots (slime), action-level slots (ROLL Flash), ThunderAgent's
program-aware capacity scheduling and venus, on two engines with the tiny model.

The workload (`bench.workload`): agent tasks whose latent difficulty sets the number of
turns of each trajectory; the prompt shows it only as a noisy hint; the environment
answers every turn after an exponential tool latency. Each mode runs as its real
counterpart: the baselines on SGLang's LRU radix cache with no priority (ThunderAgent pausing
programs by its own rule, `rollout/live_set.py`, every 5 s with 100 tokens of headroom a program,
both scaled to the bench's tools and turns), venus with the
coordinator's default policy (`scheduler.policy: venus`), its learned length predictor,
tiered KV residency, demotion, orchestration and its live set; `venus_no_moves` is venus with
`rollout.orchestration: false` (no turn moves between engines), reported beside it.

The trainer: a streaming trainer whose time per step is `factor` x T_batch, T_batch being
the measured mean rollout time of one batch (time to N batches / N, action_level, instant
trainer, in an untimed calibration round over other tasks). Of a step's time,
`gradient_fraction` is the gradients, computed per group as groups arrive (one group at a
time); the rest is the optimizer step and weight push after the B-th group. Then every
engine loads the weights as version v+1 (its cached KV is dropped, as SGLang does), the
coordinator retires the trained groups and refills the window. Rollout never runs more
than ceil(async_factor x B) groups ahead, a trajectory spanning more than
`max_version_span` versions is discarded and re-run, one at its last admissible version
is promoted: both are checked and counted.

Timings on the shared 2-core machine swing by about +-25% from run to run, so modes are
interleaved within each repeat (rotating which goes first), every mode of a repeat meets
the same tasks and the same draws, and each speedup is the median of the per-repeat
paired ratios, reported with their minimum and maximum.

Predictors: the calibration round's trajectories (other tasks) train them; each is scored
by Spearman's rho of predicted against true remaining tokens at every turn boundary of
venus's timed rounds (tasks none of them saw); `learned` also online, on the predictions
venus actually used.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from venusrl.bench.breakdown import breakdown
from venusrl.bench.report import emit
from venusrl.bench.timeline import (
    CallLog,
    TimedClient,
    process_cpu_s,
    step_columns,
    thread_cpu_s,
    turn_rows,
)
from venusrl.bench.workload import HINT_NOISE, TURNS_EASY, TURNS_SIGMA, AgentTaskEnv, make_tasks
from venusrl.coordinator.config import CoordinatorConfig, PredictorConfig
from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.predictors import (
    BackgroundPredictor,
    Example,
    GroupHistoryPredictor,
    make_predictor,
)
from venusrl.coordinator.predictors.evaluate import accuracy
from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.client import EngineClient
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.remote.process import EngineSpec
from venusrl.engine.remote.remote import spawn_engines
from venusrl.engine.stats import summed_memory_stalls
from venusrl.engine.step_log import WAITS, StepSample
from venusrl.engine.vllm.connector import scoped_environ
from venusrl.model.chat import load_tokenizer
from venusrl.model.checkpoint import load_model
from venusrl.model.tiny import make_tiny_model
from venusrl.rollout.config import RolloutConfig
from venusrl.rollout.live_set import BUFFER_PER_PROGRAM, THUNDERAGENT_INTERVAL_S, LiveSetRuleName
from venusrl.rollout.slots import SlotMode
from venusrl.rollout.worker import RolloutWorker, next_ready
from venusrl.sim.cost_model import fit
from venusrl.sim.trainer import StreamingTrainerClock
from venusrl.trace import recorded_trace
from venusrl.types import Prompt


@dataclass(slots=True, frozen=True)
class RolloutCase:
    batch_groups: int  # B
    group_size: int  # K
    async_factor: float
    engines: int
    slots_per_engine: int
    kv_tokens_per_engine: int
    tokens_per_turn: int
    tool_latency_mean_s: float  # exponential
    max_turns: int
    steps: int  # N: optimizer steps per round
    repeats: int = 1  # of the headline trainer factor
    trainer_factors: tuple[float, ...] = (0.0, 0.5, 1.0)  # trainer step time / T_batch
    headline_factor: float = 0.5
    other_factor_repeats: int = 1  # of each other trainer factor
    max_version_span: int = 2
    gradient_fraction: float = 0.75
    seed: int = 0
    test_log_lines: int = 0  # failing tests each tool answer lists (`workload.failure_lines`)
    engine_backend: str = "ours"  # `engine.backend`: ours, or vllm (its engine core in a process of its own)
    head_dim: int | None = None  # the tiny model's (None: hidden / heads = 16); vLLM's CPU attention needs >= 32
    vllm_kv_connector: str = "auto"  # `engine.vllm_kv_connector`: a moved turn's prefix KV between vLLM engines


@dataclass(slots=True, frozen=True)
class ModeSetup:
    """A scheduling mode as its real counterpart runs it."""

    slot_mode: SlotMode
    policy: str
    cache_policy: str
    demotion: bool
    orchestration: bool = False  # moves between engines (`rollout.orchestration`; priority slots only)
    work_conservation: bool = True  # `engine.work_conservation`, as a training config derives it
    live_set: LiveSetRuleName | None = None  # `SchedulerConfig.live_set_rule`: who pauses programs, by which rule


VLLM_BIND = "VLLM_CPU_OMP_THREADS_BIND"
VLLM_PAGE_SIZE = 32  # vLLM 0.32's CPU attention takes KV blocks of multiples of 32 tokens
VENUS_POLICY = CoordinatorConfig.model_fields["policy"].default  # what `scheduler.policy: venus` ranks with
SETUPS = {
    "trajectory_level": ModeSetup("trajectory_level", "action_level", "lru", demotion=False),
    "action_level": ModeSetup("action_level", "action_level", "lru", demotion=False),
    # ThunderAgent in front of SGLang/vLLM: requests forwarded per turn as they come, the engine's
    # LRU prefix cache, programs paused by its capacity rule (`scheduler.policy: thunderagent`)
    "thunderagent": ModeSetup("action_level", "action_level", "lru", demotion=False, live_set="thunderagent"),
    "venus": ModeSetup("priority", VENUS_POLICY, "tiers", demotion=True, orchestration=True, work_conservation=False,
                       live_set="venus"),
    # venus with `rollout.orchestration: false`: what its moves between engines buy or cost here
    "venus_no_moves": ModeSetup("priority", VENUS_POLICY, "tiers", demotion=True, orchestration=False,
                                work_conservation=False, live_set="venus"),
}
MODES = tuple(SETUPS)
BASELINES = ("action_level", "trajectory_level", "thunderagent")
# ThunderAgent checks its programs every 5 s (config.py L27) against SWE-agent turns whose tool
# calls take seconds (the simulator's workload: mean 4.9 s); the bench's tools take
# `tool_latency_mean_s` (0.1 s), so its live-set interval is scaled by the same ratio: one check
# per ~1 mean tool call in both (venus's live set runs at the same interval).
REAL_TOOL_MEAN_S = 4.9
# Its live programs each reserve 100 tokens of decode headroom (backend/state.py L23) against
# turns of a few hundred tokens (the simulator's SWE-agent-like workload: 250-600 generated
# tokens a turn by difficulty, about 350 at its mean); the bench's turns are `tokens_per_turn`
# (16), so the headroom is scaled by the same ratio (5 tokens, not 100: at 100, 24 programs an
# engine would reserve 2,400 of a 4,500-token pool and pause programs that fit).
REAL_TURN_TOKENS = 350
VARIANTS = {"venus": "", "venus_no_moves": "venus_no_moves_"}  # venus's modes -> prefix of their speedup keys


class RecordingPredictor(BackgroundPredictor):
    """A background predictor that also keeps the examples it learned from and the
    predictions it made (keyed by trajectory and tokens generated), for the accuracy figures,
    and how long each took from its query to the worker's poll that took it (`latencies_s`)."""

    def __init__(self, predictor) -> None:
        super().__init__(predictor)
        self.examples: list[Example] = []
        self.predicted: dict[tuple[int, int], float] = {}
        self.latencies_s: list[float] = []
        self._asked: dict[tuple[int, int], float] = {}

    def submit(self, query) -> None:
        self._asked[(query.trajectory_id, query.generated_tokens)] = time.monotonic()
        super().submit(query)

    def observe(self, examples) -> None:
        self.examples.extend(examples)
        super().observe(examples)

    def poll(self):
        results = super().poll()
        now = time.monotonic()
        for r in results:
            self.predicted[(r.trajectory_id, r.at_generated_tokens)] = r.remaining_tokens
            self.latencies_s.append(now - self._asked.pop((r.trajectory_id, r.at_generated_tokens), now))
        return results


def tasks(case: RolloutCase, seed: int) -> list[Prompt]:
    """Enough tasks for a round: N batches, the window and spare."""
    return make_tasks((case.steps + 2) * case.batch_groups, seed, case.max_turns, case.tool_latency_mean_s,
                      case.test_log_lines)


@dataclass(slots=True)
class Round:
    """One measured round: its figures (JSON) and its engine steps (for the breakdown)."""

    figures: dict[str, Any]
    samples: list[StepSample]


@contextlib.contextmanager
def _vllm_worker_on_core(core: int):
    """vLLM's CPU worker binds its OpenMP threads to every core but one by default, the same
    ones for every engine of a host; here the engine started within gets one core of its own,
    as each of our engines runs one torch thread (its processes read the variable when spawned)."""
    with scoped_environ({VLLM_BIND: str(core)}):
        yield


async def _open_engines(model_dir: Path, case: RolloutCase, setup: ModeSetup, placement: str) -> list[EngineClient]:
    """The round's engines: ours in this process or each in its own, or vLLM's (`VLLMEngine`,
    started in this event loop, as it must be). The setup's cache policy and demotion reach
    vLLM through our scheduler class (engine/vllm/tiers.py): `lru` is vLLM's own prefix cache,
    `tiers` holds live trajectories' blocks between turns by tier and demotes."""
    engine_config = EngineConfig(kv_capacity_tokens=case.kv_tokens_per_engine, page_size=1,
                                 cache_policy=setup.cache_policy, demotion=setup.demotion,
                                 work_conservation=setup.work_conservation)
    if case.engine_backend == "vllm":
        from venusrl.engine.vllm.backend import VLLMEngine

        vllm_config = EngineConfig.model_validate({**engine_config.model_dump(), "backend": "vllm",
                                                   "page_size": VLLM_PAGE_SIZE,
                                                   "vllm_kv_connector": case.vllm_kv_connector})
        engines = []
        for i in range(case.engines):
            with _vllm_worker_on_core(i % (os.cpu_count() or 1)):
                engines.append(VLLMEngine.start(model_dir, vllm_config))
        return engines
    if placement == "in_process":
        return [AsyncEngine(Engine.from_pretrained(model_dir, engine_config)) for _ in range(case.engines)]
    spec = EngineSpec(model_dir=str(model_dir), engine=engine_config, torch_threads=torch.get_num_threads())
    return list(await asyncio.to_thread(spawn_engines, [spec] * case.engines))


def _tokens(case: RolloutCase, logs: list[tuple[StepSample, ...]], stats: list, trained: list,
            coordinator: DataCoordinator, worker: RolloutWorker) -> dict[str, int]:
    """The round's token counts. On vLLM, sampled counts its decode steps' tokens only (each
    request's first token is sampled by its prefill step, which vLLM does not tell apart),
    recomputed tokens are our scheduler class's count (engine/vllm/tiers.py: prefilled again
    although computed before for the trajectory since the last weight update, which clears
    vLLM's cache), and aborted-unseen tokens are left out: vLLM does not count them."""
    sampled = sum(s.decode_seqs for log in logs for s in log)
    tokens = {"sampled": sampled, "trained": sum(t.generated_tokens for g in trained for t in g.trajectories),
              "prefill_computed": sum(s.prefill_tokens for log in logs for s in log),
              "discarded": coordinator.counts.discarded_tokens}
    tokens["recomputed"] = sum(s.recomputed_tokens for s in stats)
    if case.engine_backend == "vllm":
        return tokens
    return {**tokens, "aborted_unseen": max(0, sampled - worker.tokens.kept - worker.tokens.cancelled)}


class RecordingClient:
    """An `EngineClient` that keeps what each finished request produced from its prompt: the
    greedy-output comparison of two placements (`greedy_check`)."""

    def __init__(self, client: EngineClient, replies: dict[tuple[int, ...], list[int]]) -> None:
        self.client, self.replies = client, replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def generate(self, prompt_ids, sampling, priority=None, trajectory_id=None):
        # closed with this one, so a consumer leaving early aborts the request at once
        async with contextlib.aclosing(self.client.generate(prompt_ids, sampling, priority, trajectory_id)) as outputs:
            async for output in outputs:
                if output.finished and output.finish_reason != "abort":
                    self.replies[tuple(prompt_ids)] = output.output_ids
                yield output


async def _round(model_dir: Path, case: RolloutCase, mode: str, trainer_s: float, prompts: list[Prompt],
                 predictor: BackgroundPredictor | None = None, record: bool = False, placement: str = "in_process",
                 temperature: float = 1.0, replies: dict | None = None) -> Round:
    """N training steps of `mode` with a trainer taking `trainer_s` per step; with `replies`,
    every finished engine request's prompt and output go there; with `record`, the round's
    figures carry its turns as trace rows and its timeline (`bench/timeline.py`). The engines'
    step logs come over `EngineClient.steps_since` wherever they run (one host: their clocks
    compare)."""
    setup = SETUPS[mode]
    async_engines = await _open_engines(model_dir, case, setup, placement)
    pids = [getattr(getattr(e, "process", None), "pid", None) for e in async_engines]
    weights = load_model(model_dir).state_dict()
    if replies is not None:
        async_engines = [RecordingClient(e, replies) for e in async_engines]
    call_logs = [CallLog() for _ in async_engines]
    if record:
        async_engines = [TimedClient(e, log) for e, log in zip(async_engines, call_logs, strict=True)]
    config = CoordinatorConfig(group_size=case.group_size, batch_groups=case.batch_groups,
                               async_factor=case.async_factor, max_version_span=case.max_version_span,
                               policy=setup.policy, prior_tool_seconds=case.tool_latency_mean_s,
                               prior_tokens_per_turn=case.tokens_per_turn)
    coordinator = DataCoordinator(config, prompts)
    rollout = RolloutConfig(max_turns=case.max_turns + 1, max_new_tokens_per_turn=case.tokens_per_turn,
                            temperature=temperature, orchestration=setup.orchestration)
    ready: asyncio.Queue = asyncio.Queue()
    worker = RolloutWorker(coordinator, async_engines, load_tokenizer(model_dir), partial(AgentTaskEnv, Counter()), rollout,
                           slots=case.slots_per_engine, mode=setup.slot_mode, predictor=predictor,
                           on_ready=ready.put_nowait, live_set=setup.live_set,
                           live_set_interval_s=THUNDERAGENT_INTERVAL_S * case.tool_latency_mean_s / REAL_TOOL_MEAN_S,
                           live_set_buffer_tokens=max(1, round(BUFFER_PER_PROGRAM * case.tokens_per_turn / REAL_TURN_TOKENS)))
    trainer = StreamingTrainerClock(case.batch_groups)
    gradient_s = trainer_s * case.gradient_fraction / case.batch_groups
    optimizer_s = trainer_s * (1 - case.gradient_fraction)
    stop = asyncio.Event()
    at_start = [await e.stats() for e in async_engines]  # the idle the engines waited while starting
    cpu_at_start = [time.process_time(), *map(process_cpu_s, pids)]
    threads_at_start = thread_cpu_s()
    started = time.monotonic()  # the engines' step logs' clock
    running = asyncio.create_task(worker.run(stop=stop))
    first_batch, step_done, trained, in_flight = None, [], [], 0
    try:
        for version in range(1, case.steps + 1):
            done_at = None
            while done_at is None:
                group = await next_ready(ready, running)
                if group is None:
                    raise RuntimeError("the rollout stopped before every step's batch was ready")
                trained.append(group)
                in_flight = max(in_flight, coordinator.in_flight)
                done_at = trainer.add_group(time.monotonic() - started, gradient_s, optimizer_s)
            if first_batch is None:
                first_batch = time.monotonic() - started
            await asyncio.sleep(max(0.0, done_at - (time.monotonic() - started)))
            await asyncio.gather(*(e.update_weights(weights, version) for e in async_engines))

            worker.on_weight_version(version)
            step_done.append(time.monotonic() - started)
        stats = [await e.stats() for e in async_engines]
        cpu_s = [b - a if None not in (a, b) else None
                 for a, b in zip(cpu_at_start, [time.process_time(), *map(process_cpu_s, pids)], strict=True)]
        threads = {name: cpu - threads_at_start.get(name, 0.0) for name, cpu in thread_cpu_s().items()}
        # the step logs once the worker has stopped: read before, the turns still generating
        # (counted in the call log) could end in steps after the reading (a loaded machine)
        stop.set()
        await asyncio.gather(running, return_exceptions=True)
        logs = [(await e.steps_since(0)).samples for e in async_engines]
    finally:
        stop.set()
        await asyncio.gather(running, return_exceptions=True)
        for e in async_engines:
            await e.shutdown()
    span = max(t.turns[-1].weight_version - t.start_version for g in trained for t in g.trajectories)
    if span > case.max_version_span or in_flight > coordinator.window:
        raise AssertionError(f"{mode}: version span {span} or {in_flight} groups in flight broke the bounds")
    end = started + step_done[-1]
    samples = [s for log in logs for s in log if s.ended_s <= end]
    tokens = _tokens(case, logs, stats, trained, coordinator, worker)
    # each engine's own account of its waits over the round (vLLM keeps none)
    engine_waits = [{k: getattr(b, k) - getattr(a, k) for k in WAITS} for a, b in zip(at_start, stats, strict=True)]
    waits = None if case.engine_backend == "vllm" else {k: sum(w[k] for w in engine_waits) for k in WAITS}
    steps_after_first = [b - a for a, b in zip(step_done, step_done[1:], strict=False)]
    figures = {
        "time_to_last_step_s": step_done[-1],
        "step_done_s": step_done,
        "steady_step_s": statistics.median(steps_after_first) if steps_after_first else step_done[0],
        "time_to_first_batch_s": first_batch,
        "tokens": tokens,
        "discarded_trajectories": coordinator.counts.discarded,
        "max_version_span": span,
        "max_in_flight": in_flight,
        "window": coordinator.window,
        "weight_version": coordinator.weight_version,
        # as applied when the round stopped: the last push lands at an engine's next iteration
        "engine_weight_versions": [s.weight_version for s in stats],
        "turn_weight_versions": sorted({turn.weight_version for g in trained for t in g.trajectories for turn in t.turns}),
        "preemptions": worker.preemptions,
        "demotions": sum(s.demotions for s in stats),  # residency-aware, summed over engines
        "migrations": worker.migrations,
        # moves decided, by reason, the readings that found the pool with room for isolation, and
        # the decided moves that did not land (`RolloutWorker.move_figures`): decided = migrations + unlanded
        **worker.move_figures(),
        # the moved turns' contexts and the KV tokens moved with them (the rest the targets recompute,
        # less what their prefix caches already held)
        "moved_tokens": dict(worker.moved_tokens),
        "move_s": _move_seconds(worker.move_seconds),
        "hit_rate": sum(s.cached_tokens for s in stats) / max(1, sum(s.prompt_tokens for s in stats)),
        # summed over engines; the weight updates' drops are counted in their tier too. On vLLM:
        # the holds released for room (low_ref, high_ref; vLLM does not count its LRU evictions
        # of unused blocks), and no drops (its cache is cleared whole: None)
        "evicted_tokens": {tier: sum(s.evicted_tokens[tier] for s in stats) for tier in stats[0].evicted_tokens},
        # iterations whose admission stopped for memory, by the priority it stopped at (not on vLLM: {})
        "memory_stalls": summed_memory_stalls(stats),
        "dropped_at_weight_update_tokens": None if case.engine_backend == "vllm" else
        sum(s.dropped_at_weight_update_tokens for s in stats),
        "engine_s": case.engines * step_done[-1],
        "engine_waits_s": waits,  # summed over engines, to when their stats were read
        # CPU seconds over the round: the rollout process (driver, coordinator, predictor thread),
        # its threads by name (those alive at the end: MainThread, predictor-..., ...), then each
        # engine's process (None for in-process engines and vLLM's: not counted)
        "cpu_s": {"rollout": cpu_s[0], "rollout_threads": {k: round(v, 3) for k, v in threads.items()},
                  "engines": cpu_s[1:]},
        "placement": _placement(case, placement),
    }
    if record:  # every group the round admitted, each once
        groups = {g.id: g for g in [*trained, *coordinator.untrained_groups(), *coordinator.running_groups()]}
        figures["trace"] = recorded_trace(groups.values())
        figures["timeline"] = {
            "turns": turn_rows(groups.values(), started),
            "engines": [{"steps": step_columns(log, started), "calls": call_log.figures(started), "waits_s": w}
                        for log, call_log, w in zip(logs, call_logs, engine_waits, strict=True)],
            "prediction_latencies_s": [round(s, 6) for s in getattr(predictor, "latencies_s", [])],
        }
    return Round(figures, samples)


def _move_seconds(seconds: list[float]) -> dict[str, Any]:
    """How long the round's moves took, from the core's decision to the turn asking on its
    new engine (the simulator's `move_latency_s` is the validation's mean of these)."""
    return {"count": len(seconds), "median": statistics.median(seconds) if seconds else None,
            "mean": statistics.mean(seconds) if seconds else None, "max": max(seconds, default=None)}


def _calibrate(model_dir: Path, case: RolloutCase, placement: str) -> tuple[float, list[Example]]:
    """T_batch (action_level, instant trainer) and the examples of the round's finished
    trajectories, on tasks no timed round uses."""
    recorder = RecordingPredictor(GroupHistoryPredictor())
    try:
        calibration = asyncio.run(_round(model_dir, case, "action_level", 0.0, tasks(case, case.seed + 1000), recorder,
                                         placement=placement))
    finally:
        recorder.close()
    return calibration.figures["time_to_last_step_s"] / case.steps, recorder.examples


def _predictor_spearman(train: list[Example], venus: list[RecordingPredictor], quick: bool, workdir: Path) -> dict:
    """Each predictor trained on the calibration round, scored on venus's timed rounds."""
    from venusrl.bench.predictor import evaluate_predictor

    held_out = [e for r in venus for e in r.examples]
    out: dict[str, Any] = {"train_examples": len(train), "held_out_examples": len(held_out)}
    for kind in ("group_history", "learned", *(() if quick else ("lm",))):
        figures = evaluate_predictor(kind, train, {"held_out_prompts": held_out}, quick, None, workdir)
        out[kind] = {k: figures[k] for k in ("spearman", "spearman_by_turn", "mae", "train_examples")}
    pairs = [(r.predicted[key], e) for r in venus for e in r.examples
             if (key := (e.query.trajectory_id, e.query.generated_tokens)) in r.predicted]
    if pairs:
        online = accuracy([p for p, _ in pairs], [e for _, e in pairs])
        out["learned"]["online"] = {k: online[k] for k in ("spearman", "spearman_by_turn", "examples")}
    return out


def _summary(rounds: list[Round], cost) -> dict[str, Any]:
    """A mode's medians over its rounds at one trainer factor, and its summed breakdown."""
    figures = [r.figures for r in rounds]
    totals = {k: sum(f["tokens"][k] for f in figures) for k in figures[0]["tokens"]}
    return {
        **{k: statistics.median(f[k] for f in figures)
           for k in ("time_to_last_step_s", "steady_step_s", "time_to_first_batch_s")},
        "tokens": {k: statistics.median(f["tokens"][k] for f in figures) for k in totals},
        "discarded_trajectories": sum(f["discarded_trajectories"] for f in figures),
        "cpu_s": _median_cpu(figures),
        "breakdown": breakdown([s for r in rounds for s in r.samples], cost, sum(f["engine_s"] for f in figures),
                               totals, _summed_waits(figures)),
        "rounds": figures,
    }


def _median_cpu(figures: list[dict[str, Any]]) -> dict[str, float | None]:
    """A round's CPU seconds, median over the rounds: the rollout process's and its engines'
    together (None where an engine's process is not ours to count)."""
    engines = [None if None in f["cpu_s"]["engines"] else sum(f["cpu_s"]["engines"]) for f in figures]
    return {"rollout": statistics.median(f["cpu_s"]["rollout"] for f in figures),
            "engines": None if None in engines else statistics.median(engines)}


def _summed_waits(figures: list[dict[str, Any]]) -> dict[str, float] | None:
    if figures[0]["engine_waits_s"] is None:
        return None
    return {k: sum(f["engine_waits_s"][k] for f in figures) for k in figures[0]["engine_waits_s"]}


def _ratios(result: dict[str, Any], baseline: str, key: str, variant: str = "venus") -> list[float]:
    return [b[key] / v[key] for b, v in zip(result[baseline]["rounds"], result[variant]["rounds"], strict=True)]


WASTE = ("idle", "recompute", "wasted_discarded", "wasted_aborted")


def _speedups(cell: dict[str, Any]) -> dict[str, Any]:
    """Per baseline: venus's paired speedups (median, per repeat, min, max; `venus_no_moves_`
    keys for venus without moves), and the most any schedule could gain on the baseline's
    engine time by removing all of its idle, recompute and wasted decode
    (`waste_bound_vs_*`, the accounting a target is checked against); against action_level,
    the same without the idle in which its engines had no request at all
    (`waste_bound_with_requests_vs_action_level`). Its slots are released at every tool call,
    so such an engine had no runnable turn placed on it: that idle is won back only by more
    work in flight (a larger window), by moving turns from a busier engine, or by a window
    whose groups finish sooner and retire, not by ordering the engine's own queue. No bound
    where the engines do not count all of the waste (vLLM: recompute, aborted decode)."""
    out: dict[str, Any] = {}
    for baseline in BASELINES:
        if all(k in cell[baseline]["breakdown"]["fractions"] for k in WASTE):
            out.update(_waste_bounds(cell, baseline))
        for variant, prefix in VARIANTS.items():
            for name, key in (("end_to_end", "time_to_last_step_s"), ("first_batch", "time_to_first_batch_s"),
                              ("steady_step", "steady_step_s")):
                ratios = _ratios(cell, baseline, key, variant)
                figure = f"{prefix}{name}_speedup_vs_{baseline}"
                out[figure] = statistics.median(ratios)
                out[f"{figure}_per_repeat"] = ratios
                out[f"{figure}_min"] = min(ratios)
                out[f"{figure}_max"] = max(ratios)
    return out


def _waste_bounds(cell: dict[str, Any], baseline: str) -> dict[str, float]:
    waste = sum(cell[baseline]["breakdown"]["fractions"][k] for k in WASTE)
    out = {f"waste_bound_vs_{baseline}": 1 / max(1e-9, 1 - waste)}
    if baseline == "action_level":  # trajectory_level's no-request idle is its slots held through tools
        no_request = cell[baseline]["breakdown"]["idle_split"]["fractions"]["no_request"]
        out[f"waste_bound_with_requests_vs_{baseline}"] = 1 / max(1e-9, 1 - waste + no_request)
    return out


# Generation slots are the contended resource (the regime the paper targets): about eight
# trajectories in flight per slot, each waiting on its tool about as long as a turn generates.
QUICK = RolloutCase(batch_groups=4, group_size=4, async_factor=1.5, engines=2, slots_per_engine=2,
                    kv_tokens_per_engine=3000, tokens_per_turn=16, tool_latency_mean_s=0.1, max_turns=8, steps=4,
                    trainer_factors=(0.5,))
FULL = RolloutCase(batch_groups=8, group_size=4, async_factor=1.5, engines=2, slots_per_engine=3,
                   kv_tokens_per_engine=4500, tokens_per_turn=16, tool_latency_mean_s=0.1, max_turns=8, steps=8,
                   repeats=3, other_factor_repeats=1)


def run(quick: bool, record: bool = False, case: RolloutCase | None = None, placement: str = "process") -> dict[str, Any]:
    """Every mode at every trainer factor, `case.repeats` times, interleaved, with the engines
    placed as `placement` (process: each in its own OS process, as engines on their own
    accelerators run; in_process: threads of this one, sharing its GIL); with `record`, each
    round carries its turns as simulator trace rows and its timeline (the validation replays
    them)."""
    case = case or (QUICK if quick else FULL)
    _check_backend(case)
    torch.set_num_threads(1)  # one core per engine thread
    result: dict[str, Any] = {
        "case": asdict(case),
        "workload": {"difficulty": "Uniform(0, 1) per task, shared by its group",
                     "turns": f"round(LogNormal(log({TURNS_EASY} * ({case.max_turns}/{TURNS_EASY})**d), {TURNS_SIGMA})), "
                              f"1..{case.max_turns}, per trajectory",
                     "prompt_hint": f"vocabulary level of d + N(0, {HINT_NOISE})",
                     "tool_latency": f"Exponential, mean {case.tool_latency_mean_s}s",
                     "tool_answer": f"test counts and up to {case.test_log_lines} failing-test lines"},
        "setups": {mode: asdict(setup) for mode, setup in SETUPS.items()},
        "machine": "shared: timings carry the load of other processes; see the per-repeat spread",
        "engine_placement": _placement(case, placement),
        "engine_backend": _backend_note(case),
    }
    cells: dict[float, dict[str, list[Round]]] = {f: {m: [] for m in MODES} for f in case.trainer_factors}
    recorders: list[RecordingPredictor] = []
    with tempfile.TemporaryDirectory() as tmp, Progress() as progress:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1, head_dim=case.head_dim)
        rounds = sum(case.repeats if f == case.headline_factor else min(case.repeats, case.other_factor_repeats)
                     for f in case.trainer_factors)
        task = progress.add_task("rollout bench", total=1 + len(MODES) * rounds)
        batch_s, train_examples = _calibrate(model_dir, case, placement)
        progress.advance(task)
        predictor_path = Path(tmp) / "predictor.safetensors"
        learned = make_predictor(PredictorConfig(kind="learned"))
        learned.fit(train_examples)
        learned.save(predictor_path)
        trained = PredictorConfig(kind="learned", path=str(predictor_path), refit_every=10**9)
        result["calibration"] = {"batch_rollout_s": batch_s, "mode": "action_level", "trainer": "instant"}
        for repeat in range(case.repeats):
            prompts_seed = case.seed + repeat
            for factor in case.trainer_factors:
                if factor != case.headline_factor and repeat >= case.other_factor_repeats:
                    continue
                order = MODES[repeat % len(MODES):] + MODES[: repeat % len(MODES)]
                for mode in order:
                    predictor = RecordingPredictor(make_predictor(trained)) if mode in VARIANTS else None
                    try:
                        cells[factor][mode].append(asyncio.run(_round(
                            model_dir, case, mode, factor * batch_s, tasks(case, prompts_seed), predictor, record,
                            placement)))
                    finally:
                        if predictor is not None:
                            predictor.close()
                            recorders.append(predictor)
                    progress.advance(task)
        result["predictor_spearman"] = _predictor_spearman(train_examples, recorders, quick, Path(tmp))
    cost = fit([s for modes in cells.values() for rounds in modes.values() for r in rounds for s in r.samples],
               case.kv_tokens_per_engine)
    result["step_cost_model"] = {"fixed_s": cost.fixed_s, "token_s": cost.token_s, "kv_token_s": cost.kv_token_s}
    result["trainer"] = {"step_s": {str(f): f * batch_s for f in case.trainer_factors},
                         "gradient_fraction": case.gradient_fraction, "model": "streaming, one group at a time"}
    result["by_trainer_factor"] = {}
    for factor, modes in cells.items():
        cell = {mode: _summary(rounds, cost) for mode, rounds in modes.items()}
        cell.update(_speedups(cell))
        result["by_trainer_factor"][str(factor)] = cell
    headline = result["by_trainer_factor"][str(case.headline_factor)]
    result["headline"] = {"trainer_factor": case.headline_factor, "figure": "time to the N-th step, venus vs baseline"}
    result.update({k: v for k, v in headline.items() if "_speedup_" in k})
    for mode in MODES:
        result[mode] = headline[mode]
    result["steady_step_s"] = {mode: headline[mode]["steady_step_s"] for mode in MODES}
    result["breakdown"] = {mode: headline[mode]["breakdown"] for mode in MODES}
    return result


def _check_backend(case: RolloutCase) -> None:
    if case.engine_backend not in ("ours", "vllm"):
        raise ValueError(f"engine_backend {case.engine_backend!r}: choose ours or vllm")
    if case.engine_backend == "vllm" and (case.head_dim or 16) < 32:
        raise ValueError(f"head_dim {case.head_dim}: vLLM's CPU attention refuses head_dim below 32 (64 works)")


def _placement(case: RolloutCase, placement: str) -> str:
    return "vllm: each engine core in its own process" if case.engine_backend == "vllm" else placement


def _backend_note(case: RolloutCase) -> dict[str, Any]:
    """What each mode's setup becomes on the backend."""
    if case.engine_backend == "ours":
        return {"name": "ours"}
    return {"name": "vllm", "page_size": VLLM_PAGE_SIZE,
            "setups": "slot modes, the coordinator's policy, priorities (vLLM's priority scheduling with venus's "
                      "preemption, engine/vllm/scheduler.py) and moves between engines apply as on ours; "
                      "cache_policy and demotion reach vLLM through our scheduler class (engine/vllm/tiers.py): lru "
                      "is vLLM's own LRU prefix cache, tiers holds each live trajectory's blocks between its turns "
                      "(released LOW-held before HIGH-held when room is short) and demotes HIGH trajectories "
                      "shortest first when their KV demand exceeds the pool; a moved turn's prefix KV goes along "
                      "over NIXL (engine/vllm/nixl.py) with vllm_kv_connector nixl, else the target recomputes it",
            "kv_connector": case.vllm_kv_connector,
            "cpu_binding": f"engine i's worker on core i ({VLLM_BIND}), one core each, as ours run one thread each",
            "step_log": "vLLM's iteration details (engine/vllm/stats.py): seconds are its elapsed_ms (forward and "
                        "sampling); kv_tokens its KV blocks in use; recomputed tokens counted by our scheduler "
                        "class; no wait split and no aborted-unseen tokens (vLLM counts neither), so no waste "
                        "bound"}


def run_case(quick: bool, placement: str = "process", **overrides: Any) -> dict[str, Any]:
    """`run` on the quick or full case with some fields replaced (a sweep cell)."""
    return run(quick, case=replace(QUICK if quick else FULL, **overrides), placement=placement)


# Slots per engine (trajectories in flight per slot: 12, 6, 3) x KV budget per engine (tight:
# below what the window's trajectories hold, loose: all of it fits).
SWEEP_SLOTS = (1, 2, 4)
SWEEP_KV_TOKENS = (1500, 6000)


def sweep(placement: str = "process") -> dict[str, Any]:
    """The quick case at its trainer factor in every (slots, KV budget) cell, one repeat
    each: where venus wins and where it loses."""
    cells = []
    for slots in SWEEP_SLOTS:
        for kv in SWEEP_KV_TOKENS:
            result = run_case(True, placement, slots_per_engine=slots, kv_tokens_per_engine=kv)
            in_flight = result["venus"]["rounds"][0]["window"] * QUICK.group_size
            cells.append({
                "slots_per_engine": slots, "kv_tokens_per_engine": kv,
                "trajectories_per_slot": in_flight / (slots * QUICK.engines),
                **{k: v for k, v in result.items() if k.removeprefix(VARIANTS["venus_no_moves"]).startswith(
                    "end_to_end_speedup_vs_") and "_per_repeat" not in k},
                "time_to_last_step_s": {m: result[m]["time_to_last_step_s"] for m in MODES},
                "idle_fraction": {m: result[m]["breakdown"]["fractions"]["idle"] for m in MODES},
                "recompute_fraction": {m: result[m]["breakdown"]["fractions"]["recompute"] for m in MODES},
                "venus_wins": {b: result[f"end_to_end_speedup_vs_{b}"] > 1.0 for b in BASELINES},
            })
    return {"case": asdict(QUICK), "cells": cells, "engine_placement": placement,
            "machine": "shared: one repeat per cell, so read a cell's figure with the headline's spread"}


def greedy_check(quick: bool, placement: str) -> dict[str, Any]:
    """Venus's round (the trainer in the loop) at temperature 0 with the engines in process
    and with them placed as `placement`, on the same tasks: every prompt both rounds sent an
    engine must get the same reply. Scheduling differs between the rounds (timing), so the
    prompts they share are compared, not the rounds' order."""
    case = QUICK if quick else FULL
    torch.set_num_threads(1)
    replies: dict[str, dict[tuple[int, ...], list[int]]] = {"in_process": {}, placement: {}}
    rounds = {}
    with tempfile.TemporaryDirectory() as tmp, Progress() as progress:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1)
        task = progress.add_task(f"greedy check: in_process vs {placement}", total=2)
        for where in replies:
            rounds[where] = asyncio.run(_round(model_dir, case, "venus", 0.0, tasks(case, case.seed), placement=where,
                                               temperature=0.0, replies=replies[where])).figures
            progress.advance(task)
    shared = replies["in_process"].keys() & replies[placement].keys()
    same = sum(replies["in_process"][p] == replies[placement][p] for p in shared)
    return {"case": asdict(case), "placement": placement, "prompts_compared": len(shared),
            "prompts_identical": same, "greedy_match": same / len(shared) if shared else float("nan"),
            "requests": {where: len(r) for where, r in replies.items()},
            "time_to_last_step_s": {where: r["time_to_last_step_s"] for where, r in rounds.items()},
            "migrations": {where: r["migrations"] for where, r in rounds.items()},
            "recomputed_tokens": {where: r["tokens"]["recomputed"] for where, r in rounds.items()},
            "machine": "shared; one round each: the times are not a comparison"}


def main(quick: bool, json_out: Path | None, sweep_cells: bool = False, engine_placement: str = "process",
         greedy: bool = False, overrides: dict[str, Any] | None = None) -> None:
    """`overrides`: case fields replaced (`--slots-per-engine` and the like) for the timed table."""
    if greedy:
        emit({"greedy_check": greedy_check(quick, engine_placement)}, json_out)
        return
    emit(sweep(engine_placement) if sweep_cells else run_case(quick, engine_placement, **(overrides or {})), json_out)
