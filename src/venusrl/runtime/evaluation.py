"""Held-out evaluation of a model directory: one greedy rollout and `samples` sampled ones
(at the rollout temperature) per prompt through the environment's agent loop, on our engine
in this process. Each episode is scored by the environment's reward (the graded form) and
by any extra scorers (the right answer in any form, say), overall and per value of each
of some row fields (the operators, or problems with and without a transient tool error).

Each sampled turn draws from its own stream, seeded by `seed`, the rollout and the turn's
context length (the engine offsets it by the position in the output): the figures do not
depend on how the engine happened to batch, the same model, prompts and seed give the
same figures, and two models compared on one seed see the same draws."""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from venusrl.config import Config
from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.client import EngineClient
from venusrl.engine.engine import Engine
from venusrl.env.base import Environment, Episode
from venusrl.env.registry import environment_factory
from venusrl.model.chat import ChatTokenizer, load_tokenizer
from venusrl.model.checkpoint import load_model
from venusrl.rollout.agent_loop import GenerateFn, run_agent_loop
from venusrl.rollout.config import RolloutConfig
from venusrl.rollout.generate import engine_generate, release_quietly
from venusrl.rollout.worker import create_sandbox
from venusrl.sandbox.controller import SandboxController
from venusrl.types import Priority, Prompt

Scorer = Callable[[Episode], bool]


@dataclass(frozen=True, slots=True)
class ScoredEpisode:
    prompt_id: str
    decoding: str  # "greedy" or "sampled"
    groups: dict[str, str]  # the value of each breakdown field, as text ("" where the row has none)
    scores: dict[str, float]  # "graded" (the reward) and one per extra scorer
    turns: int


def evaluate_model(model_dir: Path, config: Config, prompts: list[Prompt], *, samples: int = 1, seed: int = 0,
                   scorers: dict[str, Scorer] | None = None, breakdowns: Sequence[str] = ()) -> dict[str, Any]:
    """Accuracy per decoding ("greedy", "sampled") and score ("graded", then `scorers`), and
    the same per value of each row field in `breakdowns`: {"greedy": {"graded": 0.5, ...},
    "sampled": {...}, "by_<field>": {"<value>": {"greedy": {...}, ..., "prompts": n}}, "prompts": N}."""
    if not prompts:
        raise ValueError("evaluation needs at least one held-out prompt")
    episodes = asyncio.run(_rollouts(model_dir, config, prompts, samples, seed, scorers or {}, breakdowns))
    result: dict[str, Any] = {**_accuracies(episodes), "prompts": len(prompts), "sampled_per_prompt": samples,
                              "seed": seed, "mean_turns": sum(e.turns for e in episodes) / len(episodes)}
    for field in breakdowns:
        groups = sorted({e.groups[field] for e in episodes})
        result[f"by_{field}"] = {g: {**_accuracies([e for e in episodes if e.groups[field] == g]),
                                     "prompts": sum(e.groups[field] == g and e.decoding == "greedy" for e in episodes)}
                                 for g in groups}
    return result


def _seeded(generate: GenerateFn, seed: int) -> GenerateFn:
    async def seeded(prompt_ids, sampling, trajectory_id):
        turn_seed = zlib.crc32(f"{seed}/{trajectory_id}/{len(prompt_ids)}".encode())
        return await generate(prompt_ids, dataclasses.replace(sampling, seed=turn_seed), trajectory_id)

    return seeded


def _accuracies(episodes: list[ScoredEpisode]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for decoding in ("greedy", "sampled"):
        chosen = [e for e in episodes if e.decoding == decoding]
        if chosen:
            out[decoding] = {name: round(sum(e.scores[name] for e in chosen) / len(chosen), 4)
                             for name in chosen[0].scores}
    return out


async def _rollouts(model_dir: Path, config: Config, prompts: list[Prompt], samples: int, seed: int,
                    scorers: dict[str, Scorer], breakdowns: Sequence[str]) -> list[ScoredEpisode]:
    env_factory = environment_factory(config.rollout.environment)
    if env_factory.needs_sandbox:
        raise ValueError(f"rollout.environment {config.rollout.environment!r}: held-out evaluation of a model "
                         "directory runs environments without a sandbox (a training run evaluates with its sandboxes)")
    tokenizer = load_tokenizer(model_dir)
    engine = AsyncEngine(Engine(load_model(model_dir, config.model.dtype, config.model.device), config.engine,
                                tokenizer))
    try:
        return await scored_episodes([engine], tokenizer, env_factory, config.rollout, prompts, samples=samples,
                                     seed=seed, scorers=scorers, breakdowns=breakdowns)
    finally:
        await engine.shutdown()


async def scored_episodes(engines: list[EngineClient], tokenizer: ChatTokenizer, env_factory: Callable[[], Environment],
                          rollout: RolloutConfig, prompts: list[Prompt], *, samples: int = 0, seed: int = 0,
                          scorers: dict[str, Scorer] | None = None, breakdowns: Sequence[str] = (),
                          sandboxes: SandboxController | None = None,
                          priority: Priority | None = None) -> list[ScoredEpisode]:
    """One greedy and `samples` sampled episodes per prompt, spread over `engines`, each scored
    by the environment's reward and `scorers`: the one evaluation loop, for a model directory
    (`evaluate_model`) and for a training run's held-out accuracy (`RolloutService.evaluate`,
    with its sandboxes and at HIGH priority, ahead of the rollout's own work)."""
    greedy = rollout.model_copy(update={"temperature": 0.0})
    generators = [_seeded(engine_generate(engine, lambda _: priority), seed) for engine in engines]

    async def one(number: int, prompt: Prompt, decoding: str, index: int) -> ScoredEpisode:
        key = f"eval-{decoding}-{prompt.id}-{index}"
        row, env, sandbox = prompt.row(), env_factory(), None
        engine = number % len(engines)
        try:
            if env.needs_sandbox:
                sandbox = await create_sandbox(env, sandboxes, row=row)
            result = await run_agent_loop(env, row, generators[engine], tokenizer,
                                          greedy if decoding == "greedy" else rollout, key, sandbox=sandbox)
        finally:
            await release_quietly(engines[engine], key)
            if sandbox is not None:
                await sandbox.kill()
        episode = Episode(row, result.messages, result.finish_reason)
        scores = {"graded": result.reward, **{name: float(score(episode)) for name, score in (scorers or {}).items()}}
        groups = {field: str(row.get(field, "")) for field in breakdowns}
        return ScoredEpisode(prompt.id, decoding, groups, scores, len(result.turns))

    jobs = [(p, "greedy", 0) for p in prompts] + [(p, "sampled", i) for p in prompts for i in range(samples)]
    return list(await asyncio.gather(*(one(n, *job) for n, job in enumerate(jobs))))
