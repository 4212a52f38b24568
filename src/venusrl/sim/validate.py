"""Validation against reality: the simulator, with a cost model fitted on this machine's
tiny-model engine, against the measured time-to-B-groups of `venusrl bench rollout`.

1. Fit: `CostModel` fitted to the step times of the real `Engine` (tiny model, CPU). When
   the benchmark is run here, on the steps of that very run: its engines share one process
   (one GIL) with each other and with the rollout worker, and a step there costs about
   twice what it costs alone. Given the benchmark's JSON instead, on steps driven here
   through the benchmark's sizes, every engine on its own thread.
2. Workload: the benchmark's own prompts (its turns per prompt, same seed), its prompt and
   observation lengths from the tiny tokenizer's chat template, turn lengths of the random
   model (up to the turn cap, ended early by a sampled end-of-turn token), its exponential
   tool latency; written as a trace and replayed.
3. Simulate each scheduling mode on the benchmark's cluster (engines, slots, KV pool, B, K,
   async_factor) and compare with the measured times (given as the bench's JSON, or measured now).
"""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from venusrl.bench import rollout as bench
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.conversation import Conversation
from venusrl.model.tiny import make_tiny_model
from venusrl.sim.cost_model import CostModel, StepSample, fit
from venusrl.sim.run import SimSpec, simulate
from venusrl.sim.systems import ROLLFLASH, SLIME, VENUS
from venusrl.sim.trainer import TrainerCost
from venusrl.sim.workload import WorkloadConfig
from venusrl.types import SamplingParams

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
    """One engine step, its wall time and its shape: tokens computed per request."""
    scheduler = engine.scheduler
    before = {r.request_id: r.num_computed for r in scheduler.requests.values()}
    started = time.perf_counter()
    outputs = step(engine)
    seconds = time.perf_counter() - started
    prefill = decode = kv = 0
    for request_id, computed in before.items():
        request = scheduler.requests.get(request_id)
        now_computed = request.num_computed if request is not None else computed + 1
        step_tokens = max(0, now_computed - computed)
        if step_tokens > 1:
            prefill += step_tokens
        elif step_tokens == 1:
            decode += 1
            kv += computed
    return StepSample(prefill, decode, kv, seconds), outputs


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


def trace_rows(case: bench.RolloutCase, prompt_tokens: int, obs_tokens: int, stop_probability: float,
               groups: int) -> list[dict[str, Any]]:
    rng = random.Random(case.seed + 1)
    rows = []
    for prompt in bench._prompts(case, groups):
        for index in range(case.group_size):
            for turn in range(prompt.metadata["turns"]):
                gen = 1
                while gen < case.tokens_per_turn and rng.random() >= stop_probability:
                    gen += 1
                rows.append({"prompt": prompt.id, "index": index, "turn": turn, "prompt_tokens": prompt_tokens,
                             "gen_tokens": gen, "obs_tokens": obs_tokens,
                             "tool_seconds": rng.expovariate(1.0 / case.tool_latency_mean_s)})
    return rows


def _chat_lengths(model_dir: Path, case: bench.RolloutCase) -> tuple[int, int, float]:
    """(prompt tokens, observation tokens, per-token probability of ending the turn)."""
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=case.kv_tokens_per_engine, page_size=1))
    prompt = bench._prompts(case, 1)[0]
    messages = [{"role": "system", "content": bench.SYSTEM_PROMPT}, *prompt.messages]
    conversation = Conversation.start(engine.tokenizer, messages, [bench.CALCULATE_TOOL])
    conversation.add_assistant_turn([ord("a")] * case.tokens_per_turn)
    added = conversation.add_messages([{"role": "user", "content": "Go on."}])
    stop = len(engine.eos_token_ids) / engine.runner.model.args.vocab_size
    return len(conversation.token_ids) - len(added) - case.tokens_per_turn, len(added), stop


def run(quick: bool, measured: dict[str, Any] | None) -> dict[str, Any]:
    case = bench.QUICK if quick else bench.FULL
    torch.set_num_threads(1)
    samples: list[StepSample] = []
    if measured is None:
        with recording_steps(samples):
            measured = bench.run(quick)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1)
        prompt_tokens, obs_tokens, stop = _chat_lengths(model_dir, case)
        if not samples:
            engines = [Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=case.kv_tokens_per_engine,
                                                                      page_size=1)) for _ in range(case.engines)]
            samples = measure_steps(engines, prompt_tokens, case)
        cost: CostModel = fit(samples, case.kv_tokens_per_engine)
        trace = Path(tmp) / "trace.jsonl"
        rows = trace_rows(case, prompt_tokens, obs_tokens, stop, 4 * case.batch_groups)
        trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        workload = WorkloadConfig(group_size=case.group_size, trace=str(trace))
        result: dict[str, Any] = {"case": measured.get("case"), "cost_model": {
            "fixed_s": cost.fixed_s, "token_s": cost.token_s, "kv_token_s": cost.kv_token_s, "steps_measured": len(samples)},
            "workload": {"prompt_tokens": prompt_tokens, "obs_tokens": obs_tokens, "turn_stop_probability": stop}}
        for mode, system in MODES.items():
            spec = SimSpec(system, workload=workload, model="tiny", generation_gpus=case.engines,
                           batch_groups=case.batch_groups, async_factor=case.async_factor, max_version_span=2,
                           steps=1, quantum=1, slots_per_engine=case.slots_per_engine, cost=cost,
                           trainer=TrainerCost(token_s=0.0, step_s=0.0), weight_sync_s=0.0,
                           predictor_spearman=0.7, prediction_latency_s=0.02, tool_seconds_prior=case.tool_latency_mean_s)
            simulated = simulate(spec).time_to_first_batch_s
            real = measured[mode]["time_to_batch_s"]
            result[mode] = {"measured_s": round(real, 3), "simulated_s": round(simulated, 3),
                            "error_pct": round(100 * (simulated - real) / real, 1)}
    return result
