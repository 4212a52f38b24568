"""`venusrl bench rollout`: time until B groups are ready, for trajectory-level slots
(slime), action-level slots (ROLL Flash) and venusrl's priority scheduling, on two engines
with the tiny model.

The workload: calculator problems whose difficulty (number of operations, 1 to 8: one turn
each) is shared by the group; after every model turn the environment answers after a tool
latency drawn from an exponential distribution (mean stated in the output), as a tool or a
user simulator would. The random tiny model's text is not the point: its turns cost real
forward passes and real KV. The full case's KV budget (4,500 tokens per engine) is below
what the window's trajectories hold at once, so engines evict and the baselines recompute.

Timings on a shared 2-core machine swing by about ±25% from run to run, so the full case runs
every mode `repeats` times, interleaved, on a different set of problems each repeat (every
mode gets the same problems and the same tool latencies within a repeat), and reports the
medians; `speedup_vs_*_per_repeat` gives the paired ratios.

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
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from functools import partial
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
from venusrl.rollout.worker import RolloutWorker, next_ready
from venusrl.sim.workload import recorded_trace
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
    steps: int  # batches rolled out: the first gives the time to B groups, the rest the window
    repeats: int = 1  # rounds of every mode, interleaved; the figures are the medians
    seed: int = 0


class WorkloadEnv(Environment):
    """Answers every turn (tool call or not) after a random latency until the prompt's turns
    are used up. `turns` is the prompt's difficulty.

    The n-th episode of a prompt in a round (`resets`, shared by the round's environments)
    draws its latencies from the seed (prompt, n), so every mode meets the same draws."""

    continues_without_tool_call = True
    required_fields = ("turns", "latency_mean_s")

    def __init__(self, resets: Counter[str]) -> None:
        self.resets = resets
        self.rng = random.Random()
        self.turns_left = 0
        self.latency_mean_s = 0.0

    async def reset(self, row: dict[str, Any], sandbox: Any = None):
        self.check_row(row)
        self.rng.seed(f"{row['id']}-{self.resets[row['id']]}")
        self.resets[row["id"]] += 1
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


def _prompts(case: RolloutCase, count: int, seed: int | None = None) -> list[Prompt]:
    rows = generate_dataset(count, seed=case.seed if seed is None else seed, max_steps=case.max_turns)
    return [Prompt(id=row["id"], messages=({"role": "user", "content": row["question"]},),
                   metadata={**row, "turns": row["steps"], "latency_mean_s": case.tool_latency_mean_s})
            for row in rows]


async def _rollout(model_dir: Path, case: RolloutCase, mode: str, predictor: BackgroundPredictor | None = None,
                   seed: int | None = None, trace: bool = False) -> dict[str, Any]:
    """Roll out `case.steps` batches of B groups as a run does: each time B groups are ready an
    (instant) trainer takes them and steps the weight version, which retires them and refills
    the window. Time to the first batch, and groups per minute over the later ones; with
    `trace`, every turn of the round as simulator trace rows (`venusrl.sim.workload`)."""
    engines = [Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=case.kv_tokens_per_engine, page_size=1))
               for _ in range(case.engines)]
    async_engines = [AsyncEngine(e) for e in engines]
    policy = "length_prediction" if mode == "priority" else "fcfs"
    coordinator = DataCoordinator(
        CoordinatorConfig(group_size=case.group_size, batch_groups=case.batch_groups, async_factor=case.async_factor,
                          policy=policy, prior_tool_seconds=case.tool_latency_mean_s),
        _prompts(case, (case.steps + 2) * case.batch_groups, seed),
    )
    config = RolloutConfig(max_turns=case.max_turns + 1, max_new_tokens_per_turn=case.tokens_per_turn, temperature=1.0)
    ready: asyncio.Queue = asyncio.Queue()
    worker = RolloutWorker(coordinator, async_engines, engines[0].tokenizer, partial(WorkloadEnv, Counter()), config,
                           slots=case.slots_per_engine, mode=mode, predictor=predictor, on_ready=ready.put_nowait)
    stop = asyncio.Event()
    started = time.perf_counter()
    running = asyncio.create_task(worker.run(stop=stop))
    batch_done, taken = [], []
    try:
        for version in range(1, case.steps + 1):
            for _ in range(case.batch_groups):
                group = await next_ready(ready, running)
                if group is None:
                    raise RuntimeError("the rollout stopped before every batch was ready")
                taken.append(group)
            batch_done.append(time.perf_counter() - started)
            worker.on_weight_version(version)
    finally:
        stop.set()
        await asyncio.gather(running, return_exceptions=True)
        for e in async_engines:
            await e.shutdown()
    stats = [e.stats() for e in engines]
    window_s = batch_done[-1] - batch_done[0]
    result = {
        "time_to_batch_s": batch_done[0],
        "batch_done_s": batch_done,
        "groups_per_minute": case.batch_groups * (case.steps - 1) / window_s * 60,
        "preemptions": worker.preemptions,
        "migrations": worker.migrations,
        "hit_rate": sum(s["cached_tokens"] for s in stats) / max(1, sum(s["prompt_tokens"] for s in stats)),
        "recomputed_tokens": sum(s["recomputed_tokens"] for s in stats),
        "evicted_tokens": sum(sum(s["evicted_tokens"].values()) for s in stats),
    }
    if trace:  # every group the round admitted, each once (a taken group may still be untrained)
        groups = {g.id: g for g in [*taken, *coordinator.untrained_groups(), *coordinator.running_groups()]}
        result["trace"] = recorded_trace(groups.values())
    return result


MODES = {"trajectory_level": "trajectory_level", "action_level": "action_level", "venus": "priority"}
# Generation slots are the contended resource (the regime the paper targets): a turn wants
# its slot about as long as its tool call takes, and there are several times more
# trajectories in flight than slots.
QUICK = RolloutCase(batch_groups=4, group_size=4, async_factor=1.5, engines=2, slots_per_engine=2,
                    kv_tokens_per_engine=4000, tokens_per_turn=24, tool_latency_mean_s=0.2, max_turns=6, steps=2)
FULL = RolloutCase(batch_groups=8, group_size=4, async_factor=1.5, engines=2, slots_per_engine=3,
                   kv_tokens_per_engine=4500, tokens_per_turn=32, tool_latency_mean_s=0.2, max_turns=8, steps=3,
                   repeats=3)


def run(quick: bool, trace: bool = False) -> dict[str, Any]:
    """Every mode's rounds; with `trace`, each round carries its turns as simulator trace
    rows (the validation replays them)."""
    case = QUICK if quick else FULL
    torch.set_num_threads(1)  # one core per engine thread
    result: dict[str, Any] = {"case": asdict(case), "tool_latency": f"exponential, mean {case.tool_latency_mean_s}s"}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in MODES}
    with tempfile.TemporaryDirectory() as tmp, Progress() as progress:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1)
        task = progress.add_task("rollout bench", total=len(MODES) * case.repeats)
        predictor_path = Path(tmp) / "predictor.pkl"
        warm_up = BackgroundPredictor(make_predictor(PredictorConfig(kind="learned", refit_every=64)))
        try:  # other problems (a seed no timed round uses), untimed; every timed round gets fresh engines
            asyncio.run(_rollout(model_dir, case, "priority", warm_up, seed=case.seed + case.repeats))
            warm_up.save(predictor_path)
        finally:
            warm_up.close()
        trained = PredictorConfig(kind="learned", path=str(predictor_path), refit_every=10**9)
        # Modes interleave within each repeat, so a slow spell of the machine hits all of them.
        for repeat in range(case.repeats):
            for name, mode in MODES.items():
                predictor = BackgroundPredictor(make_predictor(trained)) if mode == "priority" else None
                try:
                    rounds[name].append(asyncio.run(_rollout(model_dir, case, mode, predictor, case.seed + repeat, trace)))
                finally:
                    if predictor is not None:
                        predictor.close()
                progress.advance(task)
    for name, runs in rounds.items():
        result[name] = {"time_to_batch_s": statistics.median(r["time_to_batch_s"] for r in runs),
                        "groups_per_minute": statistics.median(r["groups_per_minute"] for r in runs),
                        "rounds": runs}
    venus = result["venus"]
    for baseline in ("action_level", "trajectory_level"):
        result[f"speedup_vs_{baseline}"] = result[baseline]["time_to_batch_s"] / venus["time_to_batch_s"]
        result[f"window_speedup_vs_{baseline}"] = venus["groups_per_minute"] / result[baseline]["groups_per_minute"]
        result[f"speedup_vs_{baseline}_per_repeat"] = [
            b["time_to_batch_s"] / v["time_to_batch_s"] for b, v in zip(result[baseline]["rounds"], venus["rounds"], strict=True)]
    return result


def main(quick: bool, json_out: Path | None) -> None:
    emit(run(quick), json_out)
