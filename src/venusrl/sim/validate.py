"""Validation against reality: the simulator, with a cost model fitted on this machine's
tiny-model engine, against the measured time-to-B-groups of `venusrl bench rollout`.

1. Fit: `CostModel` fitted to the step times of the real `Engine` (tiny model, CPU). When
   the benchmark is run here, on the steps of that very run: its engines share one process
   (one GIL) with each other and with the rollout worker, and a step there costs about
   twice what it costs alone. Given the benchmark's JSON instead, on steps driven here
   through the benchmark's sizes, every engine on its own thread. A step's shape is read from
   the batch its runner got (`batch_shape`), so cached prefix tokens are not counted as work.
2. Workload: each measured round replays its own turns (`bench.run(trace=True)`). The random
   model's turns are not the problems' plan: about one turn in ten holds a malformed tool
   call, which costs a turn but no tool time and does not use up the problem's turns. A given
   JSON without traces gets a synthetic trace of the same problems: chat-template lengths of
   the tiny tokenizer (every prompt shares the system prompt and tool schemas), turns of the
   random model (up to the cap, ended by a sampled end-of-turn token), and the benchmark's
   own tool-latency draws.
3. Simulate each scheduling mode on the benchmark's cluster (engines, slots, KV pool, B, K,
   async_factor) per round, and compare the medians over the rounds with the measured ones.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from venusrl.bench import rollout as bench
from venusrl.engine.batch import Batch
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.conversation import Conversation
from venusrl.model.tiny import make_tiny_model
from venusrl.sim.cost_model import CostModel, StepSample, batch_shape, fit
from venusrl.sim.run import SimSpec, simulate
from venusrl.sim.systems import ROLLFLASH, SLIME, VENUS
from venusrl.sim.trainer import TrainerCost
from venusrl.sim.workload import WorkloadConfig, shared_prefix_length
from venusrl.types import Prompt, SamplingParams

# The benchmark runs every mode on the same engine (tiers + demotion, no host tier).
MODES = {
    "trajectory_level": replace(SLIME, cache_policy="tiers", demotion=True, host_tier=False),
    "action_level": replace(ROLLFLASH, cache_policy="tiers", demotion=True, host_tier=False),
    "venus": replace(VENUS, host_tier=False),
}


def measure_steps(engines: list[Engine], prompt_len: int, case: bench.RolloutCase, repeats: int = 3) -> list[StepSample]:
    """Time schedule + forward + bookkeeping (what one `Engine.step` does) for 1..slots x
    engines concurrent requests, each a `prompt_len` prefill then decode steps. The engines
    step at once, each on its own thread as in the benchmark (`AsyncEngine`), so the fit
    includes what they cost each other: one process, one GIL, the same cores."""
    per_engine: list[list[StepSample]] = [[] for _ in engines]
    threads = [threading.Thread(target=_measure_one, args=(engine, index, prompt_len, case, repeats, per_engine[index]))
               for index, engine in enumerate(engines)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [sample for samples in per_engine for sample in samples]


def _measure_one(engine: Engine, seed: int, prompt_len: int, case: bench.RolloutCase, repeats: int,
                 samples: list[StepSample]) -> None:
    rng = random.Random(seed)
    for _ in range(repeats):
        for concurrent in range(1, case.slots_per_engine * case.engines + 1):
            for _request in range(concurrent):
                prompt = [rng.randrange(256) for _ in range(prompt_len + rng.randrange(64))]
                engine.add_request(prompt, SamplingParams(max_new_tokens=case.tokens_per_turn, stop_token_ids=(-1,)))
            while engine.has_work:
                samples.append(_timed_step(engine, Engine.step)[0])


def _timed_step(engine: Engine, step: Callable[[Engine], Any]) -> tuple[StepSample, Any]:
    """One engine step, its wall time, and its shape: the batch its runner was given, read
    with the simulator's own `batch_shape` (tokens computed, not cached hits)."""
    batches: list[Batch] = []
    run_batch = engine.runner.run

    def recorded(batch: Batch):
        batches.append(batch)
        return run_batch(batch)

    engine.runner.run = recorded
    try:
        started = time.perf_counter()
        outputs = step(engine)
        seconds = time.perf_counter() - started
    finally:
        del engine.runner.run
    prefill, contexts = batch_shape(item for batch in batches for item in batch.items)
    return StepSample(prefill, len(contexts), sum(contexts), seconds), outputs


@contextmanager
def recording_steps(samples: list[StepSample]) -> Iterator[None]:
    """Every `Engine.step` in the block, in any thread, is timed and its shape recorded. A
    measurement harness: it wraps the class's method for the block only."""
    original = Engine.step

    def recorded(engine: Engine):
        sample, outputs = _timed_step(engine, original)
        if sample.prefill_tokens or sample.decode_seqs:  # a step that ran something
            samples.append(sample)
        return outputs

    Engine.step = recorded
    try:
        yield
    finally:
        Engine.step = original


@dataclass(slots=True, frozen=True)
class ChatShape:
    """Token lengths of the benchmark's conversations under the tiny tokenizer's template."""

    prompt_tokens: dict[str, int]  # per prompt id: system prompt, tool schemas, question
    shared_prompt_tokens: int  # the prefix every prompt shares (system prompt and tools)
    obs_tokens: int  # one observation, with the template around it
    stop_probability: float  # per generated token: the random model samples end-of-turn


def trace_rows(case: bench.RolloutCase, shape: ChatShape, prompts: list[Prompt]) -> list[dict[str, Any]]:
    """The benchmark's turns as a trace. Tool latencies are the benchmark's own draws:
    `WorkloadEnv` seeds the n-th episode of a prompt with (prompt, n), and a group's n-th
    trajectory is its prompt's n-th episode."""
    lengths = random.Random(case.seed + 1)
    rows = []
    for prompt in prompts:
        for index in range(case.group_size):
            latencies = random.Random(f"{prompt.id}-{index}")
            for turn in range(prompt.metadata["turns"]):
                gen = 1
                while gen < case.tokens_per_turn and lengths.random() >= shape.stop_probability:
                    gen += 1
                rows.append({"prompt": prompt.id, "index": index, "turn": turn,
                             "prompt_tokens": shape.prompt_tokens[prompt.id],
                             "shared_prompt_tokens": shape.shared_prompt_tokens, "gen_tokens": gen,
                             "obs_tokens": shape.obs_tokens,
                             "tool_seconds": latencies.expovariate(1.0 / case.tool_latency_mean_s)})
    return rows


def chat_shape(model_dir: Path, case: bench.RolloutCase, prompts: list[Prompt]) -> ChatShape:
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=case.kv_tokens_per_engine, page_size=1))

    def start(prompt: Prompt) -> Conversation:
        messages = [{"role": "system", "content": bench.SYSTEM_PROMPT}, *prompt.messages]
        return Conversation.start(engine.tokenizer, messages, [bench.CALCULATE_TOOL])

    starts = {prompt.id: start(prompt).token_ids for prompt in prompts}
    conversation = start(prompts[0])
    conversation.add_assistant_turn([ord("a")] * case.tokens_per_turn)
    observation = conversation.add_messages([{"role": "user", "content": "Go on."}])
    return ChatShape(prompt_tokens={pid: len(ids) for pid, ids in starts.items()},
                     shared_prompt_tokens=shared_prefix_length(list(starts.values())),
                     obs_tokens=len(observation),
                     stop_probability=len(engine.eos_token_ids) / engine.runner.model.args.vocab_size)


def simulate_round(case: bench.RolloutCase, cost: CostModel, rows: list[dict[str, Any]], mode: str, trace: Path) -> float:
    """The simulated time to B groups of one benchmark round of `mode` replaying `rows`."""
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = SimSpec(MODES[mode], workload=WorkloadConfig(group_size=case.group_size, trace=str(trace)), model="tiny",
                   generation_gpus=case.engines, batch_groups=case.batch_groups, async_factor=case.async_factor,
                   max_version_span=2, steps=1, quantum=1, slots_per_engine=case.slots_per_engine, cost=cost,
                   trainer=TrainerCost(token_s=0.0, step_s=0.0), weight_sync_s=0.0,
                   predictor_spearman=0.7, prediction_latency_s=0.02, tool_seconds_prior=case.tool_latency_mean_s)
    return simulate(spec).time_to_first_batch_s


def run(quick: bool, measured: dict[str, Any] | None) -> dict[str, Any]:
    """Measured (now, or the given bench JSON) against simulated, per mode and repeat. A round
    measured now replays its own recorded turns: the random model's turns differ between
    rounds (a malformed tool call costs a turn but no tool time), so each round is simulated on
    what it ran. A given JSON without them gets the synthetic trace of its problems."""
    case = bench.QUICK if quick else bench.FULL
    torch.set_num_threads(1)
    samples: list[StepSample] = []
    if measured is None:
        with recording_steps(samples):
            measured = bench.run(quick, trace=True)
    repeats = len(measured["venus"].get("rounds", [None]))
    rounds = [bench._prompts(case, (case.steps + 2) * case.batch_groups, case.seed + r) for r in range(repeats)]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1)
        shape = chat_shape(model_dir, case, [p for prompts in rounds for p in prompts])
        if not samples:
            engines = [Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=case.kv_tokens_per_engine,
                                                                      page_size=1)) for _ in range(case.engines)]
            samples = measure_steps(engines, max(shape.prompt_tokens.values()) - shape.shared_prompt_tokens, case)
        cost: CostModel = fit(samples, case.kv_tokens_per_engine)
        result: dict[str, Any] = {"case": measured.get("case"), "cost_model": {
            "fixed_s": cost.fixed_s, "token_s": cost.token_s, "kv_token_s": cost.kv_token_s, "steps_measured": len(samples)},
            "synthetic_workload": {"prompt_tokens_max": max(shape.prompt_tokens.values()),
                                   "shared_prompt_tokens": shape.shared_prompt_tokens, "obs_tokens": shape.obs_tokens,
                                   "turn_stop_probability": shape.stop_probability}}
        for mode in MODES:
            measured_rounds = measured[mode].get("rounds", [measured[mode]])
            real = [r["time_to_batch_s"] for r in measured_rounds]
            simulated = [simulate_round(case, cost, r.get("trace") or trace_rows(case, shape, prompts), mode,
                                        Path(tmp) / "trace.jsonl")
                         for r, prompts in zip(measured_rounds, rounds, strict=True)]
            real_s, simulated_s = statistics.median(real), statistics.median(simulated)
            result[mode] = {"measured_s": round(real_s, 3), "simulated_s": round(simulated_s, 3),
                            "error_pct": round(100 * (simulated_s - real_s) / real_s, 1),
                            "measured_per_repeat_s": [round(t, 3) for t in real],
                            "simulated_per_repeat_s": [round(t, 3) for t in simulated],
                            "replayed": "recorded" if all("trace" in r for r in measured_rounds) else "synthetic"}
    return result
