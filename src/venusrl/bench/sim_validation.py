"""`venusrl simulate --scenario validate`, the simulator against reality: the simulator, with a cost model fitted on this machine's
tiny-model engine, against the measured rounds of `venusrl bench rollout` at its headline
trainer time: time to the first B groups and time to the N-th step.

1. Fit: `CostModel` fitted by the benchmark to the steps of its own engines during its
   rounds (each engine's step log, `EngineClient.steps_since`; by default each engine in its
   own process, so a step's time is not another engine's GIL wait). A step's shape is read from the batch its runner got (`batch_shape`), so cached prefix
   tokens are not counted as work.
2. Workload: each measured round replays its own turns (`bench.run(trace=True)`). The random
   model's turns are not the tasks' plan: a turn with a malformed tool call gets the parser's
   error as its observation, which costs a turn but no tool time and does not use up the
   task's turns. A given JSON without traces gets a synthetic trace of the same tasks:
   chat-template lengths of the tiny tokenizer (every prompt shares the system prompt and tool
   schemas), turns of the random model (up to the cap, ended by a sampled end-of-turn token),
   and the benchmark's own plans (`bench.workload.plan_episode`: turns and tool latencies).
3. Simulate each scheduling mode on the benchmark's cluster (engines, slots, KV pool, B, K,
   async_factor, staleness bound, the same trainer times, KV dropped at each weight update)
   per round, and compare the medians over the rounds with the measured ones.
"""

from __future__ import annotations

import random
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from venusrl.bench import rollout as bench
from venusrl.bench import workload as tasks
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.conversation import Conversation
from venusrl.model.tiny import make_tiny_model
from venusrl.sim.cost_model import CostModel
from venusrl.sim.run import SimSpec, simulate
from venusrl.sim.systems import system
from venusrl.sim.trainer import TrainerCost
from venusrl.sim.workload import WorkloadConfig
from venusrl.trace import shared_prefix_length, write_trace
from venusrl.types import Prompt

# The benchmark's modes (`bench.rollout.SETUPS`) as the simulator's systems: the baselines on
# LRU with no group priority, venus on tiers + demotion; no host tier (the training default).
MODES = {"trajectory_level": "slime", "action_level": "rollflash", "venus": "venus"}


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
                   trainer_s: float, predictor_spearman: float) -> tuple[float, float]:
    """(time to B groups, time to the N-th step) simulated for one benchmark round of `mode`
    replaying `rows`, with the benchmark's trainer (`trainer_s` per step, streamed as the
    bench streams it) and its predictor's measured accuracy."""
    write_trace(trace, rows)
    trainer = TrainerCost(token_s=0.0, step_s=trainer_s * (1 - case.gradient_fraction),
                          group_s=trainer_s * case.gradient_fraction / case.batch_groups)
    cluster = {"coordinator.batch_groups": case.batch_groups, "coordinator.async_factor": case.async_factor,
               "coordinator.max_version_span": case.max_version_span,
               "scheduler.slots_per_engine": case.slots_per_engine}
    spec = SimSpec(system(MODES[mode], overrides=cluster), workload=WorkloadConfig(group_size=case.group_size,
                   trace=str(trace)), model="tiny", generation_gpus=case.engines, steps=case.steps, quantum=1,
                   cost=cost, trainer=trainer, weight_sync_s=0.0, predictor_spearman=predictor_spearman,
                   prediction_latency_s=0.02, tool_seconds_prior=case.tool_latency_mean_s)
    result = simulate(spec)
    return result.time_to_first_batch_s, result.sim_seconds


def run(quick: bool, measured: dict[str, Any] | None) -> dict[str, Any]:
    """Measured (now, or the given bench JSON) against simulated, per mode and repeat. A round
    measured now replays its own recorded turns: the random model's turns differ between
    rounds (a malformed tool call costs a turn but no tool time), so each round is simulated on
    what it ran. A given JSON without them gets the synthetic trace of its tasks. The cost
    model is the one the bench fitted on its own engine steps."""
    torch.set_num_threads(1)
    if measured is None:
        case = bench.QUICK if quick else bench.FULL
        measured = bench.run(quick, trace=True, case=replace(case, trainer_factors=(case.headline_factor,)))
    case = bench.RolloutCase(**{**measured["case"], "trainer_factors": tuple(measured["case"]["trainer_factors"])})
    trainer_s = measured["trainer"]["step_s"][str(case.headline_factor)]
    online = measured.get("predictor_spearman", {}).get("learned", {}).get("online", {})
    rho = max(0.0, online.get("spearman", 0.7))
    repeats = len(measured["venus"]["rounds"])
    rounds = [bench.tasks(case, case.seed + r) for r in range(repeats)]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1)
        shape = chat_shape(model_dir, case, [p for prompts in rounds for p in prompts])
        fitted = measured["step_cost_model"]
        cost = CostModel(fitted["fixed_s"], fitted["token_s"], fitted["kv_token_s"], 0.0, case.kv_tokens_per_engine)
        result: dict[str, Any] = {"case": measured["case"], "trainer_step_s": trainer_s, "predictor_spearman": rho,
                                  "cost_model": fitted,
                                  "synthetic_workload": {"prompt_tokens_max": max(shape.prompt_tokens.values()),
                                                         "shared_prompt_tokens": shape.shared_prompt_tokens,
                                                         "obs_tokens": shape.obs_tokens,
                                                         "turn_stop_probability": shape.stop_probability}}
        for mode in MODES:
            measured_rounds = measured[mode]["rounds"]
            simulated = [simulate_round(case, cost, r.get("trace") or trace_rows(case, shape, prompts), mode,
                                        Path(tmp) / "trace.jsonl", trainer_s, rho)
                         for r, prompts in zip(measured_rounds, rounds, strict=True)]
            result[mode] = {"replayed": "recorded" if all("trace" in r for r in measured_rounds) else "synthetic"}
            for name, key, index in (("first_batch", "time_to_first_batch_s", 0), ("last_step", "time_to_last_step_s", 1)):
                real = [r[key] for r in measured_rounds]
                sim = [s[index] for s in simulated]
                real_s, sim_s = statistics.median(real), statistics.median(sim)
                result[mode][name] = {"measured_s": round(real_s, 3), "simulated_s": round(sim_s, 3),
                                      "error_pct": round(100 * (sim_s - real_s) / real_s, 1),
                                      "measured_per_repeat_s": [round(t, 3) for t in real],
                                      "simulated_per_repeat_s": [round(t, 3) for t in sim]}
    return result
