"""`venusrl simulate --scenario validate`, the simulator against reality: the simulator, with a cost model fitted on this machine's
tiny-model engine, against the measured rounds of `venusrl bench rollout` at its headline
trainer time: time to the first B groups and time to the N-th step.

1. Fit: `CostModel` fitted by the benchmark to the steps of its own engines during its
   rounds (each engine's step log, `EngineClient.steps_since`; by default each engine in its
   own process, so a step's time is not another engine's GIL wait). A step's shape is read from the batch its runner got (`batch_shape`), so cached prefix
   tokens are not counted as work.
2. Workload: each measured round replays its own turns (`bench.run(record=True)`). The random
   model's turns are not the tasks' plan: a turn with a malformed tool call gets the parser's
   error as its observation, which costs a turn but no tool time and does not use up the
   task's turns. A given JSON without traces gets a synthetic trace of the same tasks:
   chat-template lengths of the tiny tokenizer (every prompt shares the system prompt and tool
   schemas), turns of the random model (up to the cap, ended by a sampled end-of-turn token),
   and the benchmark's own plans (`bench.workload.plan_episode`: turns and tool latencies).
3. Simulate each scheduling mode on the benchmark's cluster (engines, slots, KV pool, B, K,
   async_factor, staleness bound, the same trainer times, KV dropped at each weight update)
   per round, and compare the medians over the rounds with the measured ones. A move between
   engines takes the mean time the calibration run's venus rounds measured for one
   (`measured_move_latency`): between engine processes its calls and copy cost tens of
   milliseconds, where the KV bytes alone would cost microseconds. The controller terms
   (`bench/controller_terms.py`: each output an engine hands over between its steps, each
   call on its loop, an output's delivery to the worker, venus's demoted-set query, the
   prediction latency) are fitted on the calibration run's timeline the same way.
4. Out of sample: the cost model, the predictor's measured accuracy, the move latency and the controller terms
   from the calibration run are used, unchanged, on runs with other tasks, a tighter KV
   budget and more slots per engine (`validation_cases`); `out_of_sample_error` is the error in
   time to the N-th step on those runs, per mode. The predictor's errors are correlated over a
   trajectory's turns with the simulator's fitted share (`sim.run.PREDICTOR_TRAJECTORY_SHARE`);
   the breakdown compares the priorities sent to engines (`priority_changes`) with the
   `set_priority` calls the engines logged.
5. Replay: with a measured dir (`--measured-dir`, `bench/measured_runs.py`) the calibration and
   validation runs are saved there when measured, and read from there instead of measured when
   it holds them, so the simulator can be checked again and again against the same runs.
6. The machine's speed: a shared machine runs the same step shapes slower in some rounds than
   in others (at 2 sequences over ~1,600 KV tokens, 0.7 ms in the calibration run and up to
   2.2 ms in some validation rounds). The cost model is the calibration run's machine, so
   `out_of_sample_error` carries that change; `out_of_sample_error_at_machine_speed` replays
   each round with the engines' work priced at the speed its own steps ran (`machine_speed`),
   the error without it (a diagnostic: the headline figure stays the calibration's alone).

The bench's baselines have no host tier (the training default), unlike the scenarios' slime
and rollflash: the engine's host tier would need the bench's modes to configure one.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from venusrl.bench import measured_runs as runs_on_disk
from venusrl.bench import rollout as bench
from venusrl.bench import workload as tasks
from venusrl.bench.controller_terms import ControllerTerms
from venusrl.bench.controller_terms import fit as fit_controller_terms
from venusrl.bench.timeline import samples_of
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.conversation import Conversation
from venusrl.model.tiny import make_tiny_model
from venusrl.sim.cost_model import CostModel
from venusrl.sim.run import PREDICTOR_TRAJECTORY_SHARE, SimResult, SimSpec, simulate
from venusrl.sim.systems import system
from venusrl.sim.trainer import TrainerCost
from venusrl.sim.workload import WorkloadConfig
from venusrl.trace import shared_prefix_length, write_trace
from venusrl.types import Prompt

# The benchmark's modes (`bench.rollout.SETUPS`) as the simulator's systems: the baselines on
# LRU with no group priority, venus on tiers + demotion; no host tier (the training default).
MODES = {"trajectory_level": "slime", "action_level": "rollflash", "venus": "venus"}
CALIBRATION = "calibration"  # the fitted run's name in a measured dir


@dataclass(slots=True, frozen=True)
class ChatShape:
    """Token lengths of the benchmark's conversations under the tiny tokenizer's template."""

    prompt_tokens: dict[str, int]  # per prompt id: system prompt, tool schemas, question
    shared_prompt_tokens: int  # the prefix every prompt shares (system prompt and tools)
    obs_tokens: int  # one observation, with the template around it
    stop_probability: float  # per generated token: the random model samples end-of-turn


def trace_rows(case: bench.RolloutCase, shape: ChatShape, prompts: list[Prompt]) -> list[dict[str, Any]]:
    """The benchmark's turns as a trace. Turns and tool latencies are the benchmark's own
    plans: `AgentTaskEnv` follows plan (task, n) for the n-th episode of a task, and a
    group's n-th trajectory is its task's n-th episode."""
    lengths = random.Random(case.seed + 1)
    rows = []
    for prompt in prompts:
        for index in range(case.group_size):
            plan = tasks.plan_episode(prompt.row(), index)
            for turn in range(plan.turns):
                gen = 1
                while gen < case.tokens_per_turn and lengths.random() >= shape.stop_probability:
                    gen += 1
                rows.append({"prompt": prompt.id, "index": index, "turn": turn,
                             "prompt_tokens": shape.prompt_tokens[prompt.id],
                             "shared_prompt_tokens": shape.shared_prompt_tokens, "gen_tokens": gen,
                             "obs_tokens": shape.obs_tokens if turn + 1 < plan.turns else 0,
                             "tool_seconds": plan.latencies_s[turn] if turn + 1 < plan.turns else 0.0})
    return rows


def chat_shape(model_dir: Path, case: bench.RolloutCase, prompts: list[Prompt]) -> ChatShape:
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=case.kv_tokens_per_engine, page_size=1))

    def start(prompt: Prompt) -> Conversation:
        messages = [{"role": "system", "content": tasks.SYSTEM_PROMPT}, *prompt.messages]
        return Conversation.start(engine.tokenizer, messages, [tasks.RUN_TESTS_TOOL])

    starts = {prompt.id: start(prompt).token_ids for prompt in prompts}
    conversation = start(prompts[0])
    conversation.add_assistant_turn([ord("a")] * case.tokens_per_turn)
    observation = conversation.add_messages([{"role": "user", "content": "ran 12 tests: 3 failed"}])
    return ChatShape(prompt_tokens={pid: len(ids) for pid, ids in starts.items()},
                     shared_prompt_tokens=shared_prefix_length(list(starts.values())),
                     obs_tokens=len(observation),
                     stop_probability=len(engine.eos_token_ids) / engine.runner.model.args.vocab_size)


def simulate_round(case: bench.RolloutCase, cost: CostModel, rows: list[dict[str, Any]], mode: str, trace: Path,
                   trainer_s: float, predictor_spearman: float, move_latency_s: float = 0.0,
                   terms: ControllerTerms | None = None, machine_speed: float = 1.0) -> SimResult:
    """One benchmark round of `mode` simulated replaying `rows`, with the benchmark's trainer
    (`trainer_s` per step, streamed as the bench streams it), the predictor's measured
    accuracy, the measured time of a move between engine processes and the controller
    terms fitted on the calibration run (None: none, and a prediction takes 20 ms), the
    engines' work (steps, outputs, calls) priced `machine_speed` times as long."""
    if terms is not None:
        cost = replace(cost, output_s=terms.output_s, call_s=terms.call_s)
    cost = slowed(cost, machine_speed)
    write_trace(trace, rows)
    trainer = TrainerCost(token_s=0.0, step_s=trainer_s * (1 - case.gradient_fraction),
                          group_s=trainer_s * case.gradient_fraction / case.batch_groups)
    cluster = {"coordinator.batch_groups": case.batch_groups, "coordinator.async_factor": case.async_factor,
               "coordinator.max_version_span": case.max_version_span,
               "scheduler.slots_per_engine": case.slots_per_engine}
    spec = SimSpec(system(MODES[mode], overrides=cluster), workload=WorkloadConfig(group_size=case.group_size,
                   trace=str(trace)), model="tiny", generation_gpus=case.engines, steps=case.steps, quantum=1,
                   cost=replace(cost, kv_capacity_tokens=case.kv_tokens_per_engine), trainer=trainer,
                   weight_sync_s=0.0, predictor_spearman=predictor_spearman,
                   prediction_latency_s=terms.prediction_latency_s if terms else 0.02,
                   tool_seconds_prior=case.tool_latency_mean_s, move_latency_s=move_latency_s,
                   delivery_latency_s=terms.delivery_latency_s if terms else 0.0,
                   demoted_query_s=terms.demoted_query_s if terms else 0.0)
    return simulate(spec)


def slowed(cost: CostModel, factor: float) -> CostModel:
    """`cost` on a machine `factor` times slower at the engines' CPU work: its steps, the
    outputs handed over between them and the calls on their loops."""
    return replace(cost, fixed_s=cost.fixed_s * factor, token_s=cost.token_s * factor,
                   kv_token_s=cost.kv_token_s * factor, output_s=cost.output_s * factor, call_s=cost.call_s * factor)


def machine_speed(measured_round: dict[str, Any], cost: CostModel) -> float:
    """How many times as long the round's engines took for the steps they ran (to its last
    optimizer step) as `cost` prices the same step shapes: the machine's speed during the
    round relative to the calibration run's, read from its steps alone (their shapes are the
    same work on any machine), never from the times the validation compares."""
    end = measured_round["time_to_last_step_s"]
    took = priced = 0.0
    for engine in measured_round["timeline"]["engines"]:
        for step in samples_of(engine["steps"]):
            if 0 <= step.ended_s <= end:
                took += step.seconds
                priced += cost.step_seconds(step.prefill_tokens, step.decode_seqs, step.kv_tokens)
    return took / priced if priced else 1.0


def measured_spearman(measured: dict[str, Any]) -> float:
    """The learned predictor's online Spearman correlation the bench measured on venus's
    rounds (clamped into the simulated predictor's (0, 1]): measured, never assumed."""
    try:
        rho = measured["predictor_spearman"]["learned"]["online"]["spearman"]
    except KeyError:
        raise ValueError("the bench JSON has no predictor_spearman.learned.online.spearman: the validation "
                         "uses the predictor's measured accuracy, so rerun `venusrl bench rollout` to record it") from None
    return min(1.0, max(0.01, rho))


def measured_move_latency(measured: dict[str, Any]) -> float:
    """The mean time a move between engine processes took over venus's measured rounds (the
    calls that start it on the target, the prefix KV copy, the release on the source): the
    mean, as what a move costs the moved turns in all is their sum, and the times have a long
    tail (a call queued behind a weight update). 0 for a JSON recorded before the bench timed
    moves, or with none."""
    timed = [r["move_s"] for r in measured["venus"]["rounds"] if r.get("move_s", {}).get("count")]
    count = sum(m["count"] for m in timed)
    return sum(m["mean"] * m["count"] for m in timed) / count if count else 0.0


def case_of(measured: dict[str, Any]) -> bench.RolloutCase:
    return bench.RolloutCase(**{**measured["case"], "trainer_factors": tuple(measured["case"]["trainer_factors"])})


def measured_case(case: bench.RolloutCase) -> bench.RolloutCase:
    """What `measure` runs of `case`: its headline trainer factor only."""
    return replace(case, trainer_factors=(case.headline_factor,))


def measure(case: bench.RolloutCase, quick: bool) -> dict[str, Any]:
    """The bench at its headline trainer factor only, each round with its recorded turns and
    timeline (`quick`: the predictor figures without the LM predictor)."""
    return bench.run(quick, record=True, case=measured_case(case))


def measured_runs(quick: bool, measured: dict[str, Any] | None, case: bench.RolloutCase | None,
                  validations: dict[str, bench.RolloutCase] | None,
                  measured_dir: Path | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The calibration run and the validation runs (default `validation_cases` of the
    calibration's case): read from `measured_dir` where it holds them, else measured now
    (the calibration taken from `measured` where given) and, with `measured_dir`, saved there."""
    reading = measured_dir is not None and not runs_on_disk.is_empty(measured_dir)
    if reading and measured is not None:
        raise runs_on_disk.MeasuredRunsError(
            f"measured dir {measured_dir} holds runs already: give it or a bench JSON, not both")

    def obtained(name: str, run_case: bench.RolloutCase, given: dict[str, Any] | None = None) -> dict[str, Any]:
        if reading:
            return runs_on_disk.load(measured_dir, name, _case_fields(measured_case(run_case)), tuple(MODES))
        run = given if given is not None else measure(run_case, quick)
        if measured_dir is not None:
            runs_on_disk.save(measured_dir, name, run)
        return run

    calibration = obtained(CALIBRATION, case or (bench.QUICK if quick else bench.FULL), measured)
    expected = validations if validations is not None else validation_cases(case_of(calibration))
    return calibration, {name: obtained(name, run_case) for name, run_case in expected.items()}


def _case_fields(case: bench.RolloutCase) -> dict[str, Any]:
    """`case` as its bench JSON spells it."""
    return json.loads(json.dumps(asdict(case)))


def replay(measured: dict[str, Any], cost: CostModel, rho: float, workdir: Path,
           shape: ChatShape | None = None, move_latency_s: float = 0.0,
           terms: ControllerTerms | None = None, at_machine_speed: bool = False) -> dict[str, Any]:
    """Per mode: each measured round of `measured` simulated on its own turns (or, for a JSON
    without them, the synthetic trace of its tasks, from `shape`) with `cost`, `rho` and
    `move_latency_s`, and the medians over rounds compared: time to the first batch, time to the N-th step, and the
    breakdown's recomputed tokens, discarded trajectories and idle engine time.
    `at_machine_speed`: each round's engine work priced at the machine's speed during it
    (`machine_speed`), a diagnostic that takes a slower or faster machine out of the error."""
    case = case_of(measured)
    trainer_s = measured["trainer"]["step_s"][str(case.headline_factor)]
    repeats = len(measured["venus"]["rounds"])
    rounds = [bench.tasks(case, case.seed + r) for r in range(repeats)]
    out: dict[str, Any] = {}
    for mode in MODES:
        measured_rounds = measured[mode]["rounds"]
        if shape is None and not all(r.get("trace") for r in measured_rounds):
            raise ValueError(f"{mode}: a measured round has no trace to replay")
        speeds = [machine_speed(r, cost) if at_machine_speed else 1.0 for r in measured_rounds]
        simulated = [simulate_round(case, cost, r.get("trace") or trace_rows(case, shape, prompts), mode,
                                    workdir / "trace.jsonl", trainer_s, rho, move_latency_s, terms, speed)
                     for r, prompts, speed in zip(measured_rounds, rounds, speeds, strict=True)]
        out[mode] = {"replayed": "recorded" if all("trace" in r for r in measured_rounds) else "synthetic"}
        if at_machine_speed:
            out[mode]["machine_speed_per_repeat"] = [round(speed, 3) for speed in speeds]
        figures = (("first_batch", [r["time_to_first_batch_s"] for r in measured_rounds],
                    [s.time_to_first_batch_s for s in simulated]),
                   ("last_step", [r["time_to_last_step_s"] for r in measured_rounds], [s.sim_seconds for s in simulated]))
        for name, real, sim in figures:
            real_s, sim_s = statistics.median(real), statistics.median(sim)
            out[mode][name] = {"measured_s": round(real_s, 3), "simulated_s": round(sim_s, 3),
                               "error_pct": round(100 * (sim_s - real_s) / real_s, 1),
                               "measured_per_repeat_s": [round(t, 3) for t in real],
                               "simulated_per_repeat_s": [round(t, 3) for t in sim]}
        out[mode]["breakdown"] = {
            "recomputed_tokens": {"measured": statistics.median(r["tokens"]["recomputed"] for r in measured_rounds),
                                  "simulated": statistics.median(s.engine["recomputed_tokens"] for s in simulated)},
            "discarded_trajectories": {
                "measured": statistics.median(r["discarded_trajectories"] for r in measured_rounds),
                "simulated": statistics.median(s.worker["discarded"] for s in simulated)},
            "idle_fraction": {"measured": measured[mode]["breakdown"]["fractions"]["idle"],
                              "simulated": round(statistics.median(1 - s.engine["busy_fraction"] for s in simulated), 4)},
            **{name: {"measured": _median_of(measured_rounds, real), "simulated": statistics.median(sim(s) for s in simulated)}
               for name, real, sim in REPLAYED_COUNTS},
        }
    return out


def _set_priority_calls(measured_round: dict[str, Any]) -> int | None:
    """The `set_priority` calls the round's engines logged up to its last optimizer step (each
    priority the worker sent an engine); None for a round recorded without a timeline."""
    timeline = measured_round.get("timeline")
    if not timeline:
        return None
    end = measured_round["time_to_last_step_s"]
    return sum(1 for engine in timeline["engines"]
               for name, started in zip(engine["calls"]["calls"]["name"], engine["calls"]["calls"]["started_s"],
                                        strict=True)
               if name == "set_priority" and started <= end)


def _at(*path: str) -> Callable[[dict[str, Any]], Any]:
    """The measured round's figure at the key `path`; None for a JSON recorded before the
    bench reported it."""
    def figure(measured_round: dict[str, Any]) -> Any:
        value: Any = measured_round
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value
    return figure


# What makes a replay's recompute and idle differ from the measured round's: (name, the
# measured round's figure, the simulated figure).
REPLAYED_COUNTS = (
    ("dropped_at_weight_update_tokens", _at("dropped_at_weight_update_tokens"),
     lambda s: s.engine["dropped_at_weight_update_tokens"]),
    ("evicted_high_ref_tokens", _at("evicted_tokens", "high_ref"), lambda s: s.engine["evicted_tokens"]["high_ref"]),
    ("preemptions", _at("preemptions"), lambda s: s.worker["preemptions"]),
    ("migrations", _at("migrations"), lambda s: s.worker["migrations"]),
    ("priority_changes", _set_priority_calls, lambda s: s.worker["priority_changes"]),
)


def _median_of(rounds: list[dict[str, Any]], figure: Callable[[dict[str, Any]], Any]) -> float | None:
    """The median over measured rounds of `figure`; None where a round lacks it."""
    values = [figure(r) for r in rounds]
    return None if any(v is None for v in values) else statistics.median(values)


def validation_cases(case: bench.RolloutCase) -> dict[str, bench.RolloutCase]:
    """Runs the fit never sees, each differing from the calibration run in one setting: other
    tasks (seed), a tighter KV budget (two thirds), one more slot per engine."""
    return {"other_seed": replace(case, seed=case.seed + 100),
            "tight_kv": replace(case, kv_tokens_per_engine=case.kv_tokens_per_engine * 2 // 3),
            "more_slots": replace(case, slots_per_engine=case.slots_per_engine + 1)}


def out_of_sample_error(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per mode, the signed error in time to the N-th step on every validation run, their
    median and the largest in size."""
    out = {}
    for mode in MODES:
        errors = {name: run[mode]["last_step"]["error_pct"] for name, run in runs.items()}
        out[mode] = {"median_pct": round(statistics.median(errors.values()), 1),
                     "max_abs_pct": max(abs(e) for e in errors.values()), "per_run_pct": errors}
    return out


def run(quick: bool, measured: dict[str, Any] | None, case: bench.RolloutCase | None = None,
        validations: dict[str, bench.RolloutCase] | None = None, measured_dir: Path | None = None) -> dict[str, Any]:
    """Fit on a calibration run (measured now, the given bench JSON, or read from
    `measured_dir`), validate out of sample (`measured_runs`).

    In sample: the calibration run's rounds replayed with the cost model the bench fitted on
    its own engine steps (the figure the earlier validation gave). Out of sample: each run of
    `validations` (default `validation_cases`) measured now and replayed with the calibration
    run's cost model and predictor accuracy, nothing refitted: `out_of_sample_error` is the
    time to the N-th step's error per mode on those runs. A round measured now replays its own
    recorded turns: the random model's turns differ between rounds (a malformed tool call costs
    a turn but no tool time), so each round is simulated on what it ran. A given JSON without
    them gets the synthetic trace of its tasks."""
    torch.set_num_threads(1)
    measured, validation_runs = measured_runs(quick, measured, case, validations, measured_dir)
    calibration = case_of(measured)
    rho = measured_spearman(measured)
    move_latency_s = measured_move_latency(measured)
    recorded = all(r.get("timeline") for mode in MODES for r in measured[mode]["rounds"])
    terms = fit_controller_terms(measured, MODES) if recorded else None
    fitted = measured["step_cost_model"]
    cost = CostModel(fitted["fixed_s"], fitted["token_s"], fitted["kv_token_s"], 0.0, calibration.kv_tokens_per_engine)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1)
        rounds = [bench.tasks(calibration, calibration.seed + r) for r in range(len(measured["venus"]["rounds"]))]
        shape = chat_shape(model_dir, calibration, [p for prompts in rounds for p in prompts])
        result: dict[str, Any] = {
            "case": measured["case"], "trainer_step_s": measured["trainer"]["step_s"][str(calibration.headline_factor)],
            "predictor_spearman": rho, "predictor_trajectory_share": PREDICTOR_TRAJECTORY_SHARE,
            "move_latency_s": move_latency_s, "cost_model": fitted,
            "controller_terms": terms.to_dict() if terms else "none: the calibration run has no timelines",
            "synthetic_workload": {"prompt_tokens_max": max(shape.prompt_tokens.values()),
                                   "shared_prompt_tokens": shape.shared_prompt_tokens, "obs_tokens": shape.obs_tokens,
                                   "turn_stop_probability": shape.stop_probability},
            "in_sample": replay(measured, cost, rho, Path(tmp), shape, move_latency_s, terms)}
        runs = {name: {"case": run_measured["case"], **replay(run_measured, cost, rho, Path(tmp),
                                                              move_latency_s=move_latency_s, terms=terms)}
                for name, run_measured in validation_runs.items()}
        result["out_of_sample"] = runs
        if runs:
            result["out_of_sample_error"] = out_of_sample_error(runs)
        if runs and terms is not None:  # the same runs replayed without them: what the terms change
            result["out_of_sample_error_without_controller_terms"] = out_of_sample_error(
                {name: replay(run_measured, cost, rho, Path(tmp), move_latency_s=move_latency_s)
                 for name, run_measured in validation_runs.items()})
        if runs and recorded:  # the same runs at the machine's speed during each round: the rest of the error
            at_speed = {name: replay(run_measured, cost, rho, Path(tmp), move_latency_s=move_latency_s, terms=terms,
                                     at_machine_speed=True)
                        for name, run_measured in validation_runs.items()}
            result["out_of_sample_error_at_machine_speed"] = out_of_sample_error(at_speed)
            result["out_of_sample_at_machine_speed"] = at_speed
            result["machine_speed"] = {name: {mode: run[mode]["machine_speed_per_repeat"] for mode in MODES}
                                       for name, run in at_speed.items()}
    return result
