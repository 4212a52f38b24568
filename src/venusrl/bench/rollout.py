"""`venusrl bench rollout`: time until B groups are ready, for trajectory-level slots
(slime), action-level slots (ROLL Flash) and venusrl's priority scheduling, on two engines
with the tiny model.

The workload: calculator problems whose difficulty (number of operations, 1 to 8: one turn
each) is shared by the group; after every model turn the environment answers after a tool
latency drawn from an exponential distribution (mean stated in the output), as a tool or a
user simulator would. The random tiny model's text is not the point: its turns cost real
forward passes and real KV.

venus ranks groups by predicted length. Its `learned` predictor is trained the way a run
trains it, on finished trajectories: those of one untimed round over other problems (a
previous step's rollouts), so the timed round starts with a predictor that has seen the
workload but not these prompts. It is then loaded for the timed round and refit only between
rounds: on 2 cores a refit during the round would take CPU from the engines (a cluster refits
on the coordinator's own cores). The baselines use no prediction.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from venusrl.bench.report import emit
from venusrl.coordinator.config import CoordinatorConfig, PredictorConfig
from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.coordinator.predictors import BackgroundPredictor, make_predictor
from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.env.base import Environment, Episode, StepResult
from venusrl.env.calculator import CALCULATE_TOOL, SYSTEM_PROMPT, generate_dataset
from venusrl.model.tiny import make_tiny_model
from venusrl.rollout.config import RolloutConfig
from venusrl.rollout.worker import RolloutWorker
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
    seed: int = 0


class WorkloadEnv(Environment):
    """Answers every turn (tool call or not) after a random latency until the prompt's turns
    are used up. `turns` is the prompt's difficulty."""

    continues_without_tool_call = True
    required_fields = ("turns", "latency_mean_s")

    def __init__(self) -> None:
        self.rng = random.Random()
        self.turns_left = 0
        self.latency_mean_s = 0.0

    async def reset(self, row: dict[str, Any], sandbox: Any = None):
        self.check_row(row)
        self.rng.seed(f"{row['id']}-{id(self)}")
        self.turns_left, self.latency_mean_s = row["turns"], row["latency_mean_s"]
        return [{"role": "system", "content": SYSTEM_PROMPT}, *row["messages"]], [CALCULATE_TOOL]

    async def _after_latency(self, messages: list[dict[str, Any]]) -> StepResult:
        await asyncio.sleep(self.rng.expovariate(1.0 / self.latency_mean_s))
        self.turns_left -= 1
        return StepResult(messages, done=self.turns_left <= 0)

    async def step(self, tool_calls):
        return await self._after_latency([{"role": "tool", "tool_call_id": c["id"], "content": "42"} for c in tool_calls])

    async def respond(self):
        return await self._after_latency([{"role": "user", "content": "Go on."}])

    def reward(self, episode: Episode) -> float:
        return 0.0


def _prompts(case: RolloutCase, count: int, seed: int) -> list[Prompt]:
    rows = generate_dataset(count, seed=seed, max_steps=case.max_turns)
    return [Prompt(id=row["id"], messages=({"role": "user", "content": row["question"]},),
                   metadata={**row, "turns": row["steps"], "latency_mean_s": case.tool_latency_mean_s})
            for row in rows]


async def _time_to_batch(model_dir: Path, case: RolloutCase, mode: str, predictor: BackgroundPredictor | None = None,
                         seed: int | None = None) -> dict[str, float]:
    engines = [Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=case.kv_tokens_per_engine, page_size=1))
               for _ in range(case.engines)]
    async_engines = [AsyncEngine(e) for e in engines]
    policy = "length_prediction" if mode == "priority" else "fcfs"
    coordinator = DataCoordinator(
        CoordinatorConfig(group_size=case.group_size, batch_groups=case.batch_groups, async_factor=case.async_factor,
                          policy=policy, prior_tool_seconds=case.tool_latency_mean_s),
        _prompts(case, 4 * case.batch_groups, case.seed if seed is None else seed),
    )
    config = RolloutConfig(max_turns=case.max_turns + 1, max_new_tokens_per_turn=case.tokens_per_turn, temperature=1.0)
    worker = RolloutWorker(coordinator, async_engines, engines[0].tokenizer, WorkloadEnv, config,
                           slots=case.slots_per_engine, mode=mode, predictor=predictor)
    started = time.perf_counter()
    try:
        await worker.run(groups=case.batch_groups)
    finally:
        for e in async_engines:
            await e.shutdown()
    seconds = time.perf_counter() - started
    stats = [e.stats() for e in engines]
    return {
        "time_to_batch_s": seconds,
        "groups_per_minute": case.batch_groups / seconds * 60,
        "preemptions": worker.preemptions,
        "migrations": worker.migrations,
        "hit_rate": sum(s["cached_tokens"] for s in stats) / max(1, sum(s["prompt_tokens"] for s in stats)),
        "recomputed_tokens": sum(s["recomputed_tokens"] for s in stats),
    }


MODES = {"trajectory_level": "trajectory_level", "action_level": "action_level", "venus": "priority"}
# Generation slots are the contended resource (the regime the paper targets): a turn wants
# its slot about as long as its tool call takes, and there are several times more
# trajectories in flight than slots.
QUICK = RolloutCase(batch_groups=4, group_size=4, async_factor=1.5, engines=2, slots_per_engine=2,
                    kv_tokens_per_engine=4000, tokens_per_turn=24, tool_latency_mean_s=0.2, max_turns=6)
FULL = RolloutCase(batch_groups=8, group_size=4, async_factor=1.5, engines=2, slots_per_engine=3,
                   kv_tokens_per_engine=6000, tokens_per_turn=32, tool_latency_mean_s=0.2, max_turns=8)


def run(quick: bool) -> dict[str, Any]:
    case = QUICK if quick else FULL
    torch.set_num_threads(1)  # one core per engine thread
    result: dict[str, Any] = {"case": asdict(case), "tool_latency": f"exponential, mean {case.tool_latency_mean_s}s"}
    with tempfile.TemporaryDirectory() as tmp, Progress() as progress:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1)
        task = progress.add_task("rollout bench", total=len(MODES))
        predictor_path = Path(tmp) / "predictor.pkl"
        warm_up = BackgroundPredictor(make_predictor(PredictorConfig(kind="learned", refit_every=64)))
        try:  # other problems (another seed), untimed; every timed round gets fresh engines
            asyncio.run(_time_to_batch(model_dir, case, "priority", warm_up, seed=case.seed + 1))
            warm_up.save(predictor_path)
        finally:
            warm_up.close()
        trained = PredictorConfig(kind="learned", path=str(predictor_path), refit_every=10**9)
        for name, mode in MODES.items():
            predictor = BackgroundPredictor(make_predictor(trained)) if mode == "priority" else None
            try:
                result[name] = asyncio.run(_time_to_batch(model_dir, case, mode, predictor))
            finally:
                if predictor is not None:
                    predictor.close()
            progress.advance(task)
    venus = result["venus"]["time_to_batch_s"]
    result["speedup_vs_action_level"] = result["action_level"]["time_to_batch_s"] / venus
    result["speedup_vs_trajectory_level"] = result["trajectory_level"]["time_to_batch_s"] / venus
    return result


def main(quick: bool, json_out: Path | None) -> None:
    emit(run(quick), json_out)
