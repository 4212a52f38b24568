"""A synthetic multi-turn agent workload with varying difficulty, for predictor benchmarks
and tests.

Each prompt has a hidden difficulty d in [0, 1]. Its text names components whose vocabulary
shifts with a noisy copy of d (`hint_words`); harder prompts take more turns and longer turns.
After each turn but the last, the tool reports failing tests that fall towards zero as the
trajectory nears its end, with tracebacks more likely on hard prompts. The K trajectories of
a prompt share d but draw their own turns and lengths (sampling temperature). Nothing in the
text states a length: a predictor has to learn the relation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from venusrl.coordinator.predictors.query import (
    Example,
    PredictionQuery,
    examples_of_finished,
    query_from_messages,
)

_AREAS = (
    ("typo", "readme", "docstring", "comment", "rename"),
    ("config", "flag", "option", "default", "logging"),
    ("parser", "validation", "schema", "format", "encoding"),
    ("cache", "index", "query", "pagination", "serializer"),
    ("scheduler", "worker", "retry", "timeout", "queue"),
    ("concurrency", "lock", "race", "deadlock", "threading"),
    ("compiler", "optimizer", "codegen", "allocator", "kernel"),
    ("distributed", "consensus", "replication", "partition", "migration"),
)
_FILLER = ("please", "fix", "the", "issue", "in", "module", "so", "that", "tests", "pass", "and", "update", "code")


@dataclass(slots=True, frozen=True)
class SyntheticTrajectory:
    prompt_id: str
    difficulty: float
    turn_tokens: tuple[int, ...]
    queries: tuple[PredictionQuery, ...]  # one per turn boundary, before each turn

    @property
    def total_tokens(self) -> int:
        return sum(self.turn_tokens)

    def examples(self) -> list[Example]:
        return examples_of_finished(self.queries, self.total_tokens)


@dataclass(slots=True, frozen=True)
class SyntheticTask:
    prompt_id: str
    difficulty: float
    text: str


def make_tasks(n_prompts: int, seed: int = 0, prefix: str = "task") -> list[SyntheticTask]:
    rng = np.random.default_rng(seed)
    tasks = []
    for p in range(n_prompts):
        difficulty = float(rng.uniform())
        tasks.append(SyntheticTask(f"{prefix}-{p}", difficulty, _prompt_text(rng, difficulty)))
    return tasks


def rollout(tasks: list[SyntheticTask], group_size: int = 8, seed: int = 0) -> list[SyntheticTrajectory]:
    """K trajectories of each task; another seed is another epoch over the same tasks."""
    rng = np.random.default_rng(seed)
    out: list[SyntheticTrajectory] = []
    for task in tasks:
        plans = [_plan(rng, task.difficulty) for _ in range(group_size)]
        totals = [sum(tokens) for tokens, _ in plans]
        for k, (tokens, observations) in enumerate(plans):
            mates_totals = totals[:k] + totals[k + 1 :]
            queries = _queries(task.prompt_id, task.text, tokens, observations, mates_totals)
            out.append(SyntheticTrajectory(task.prompt_id, task.difficulty, tuple(tokens), tuple(queries)))
    return out


def synthesize(n_prompts: int, group_size: int = 8, seed: int = 0, prefix: str = "task") -> list[SyntheticTrajectory]:
    return rollout(make_tasks(n_prompts, seed, prefix), group_size, seed + 1)


def hint_area(noisy_difficulty: float) -> tuple[str, ...]:
    """The vocabulary of the level a noisy copy of the difficulty falls in: prompts show it,
    so a predictor can learn the hint, not read the difficulty (prompts of one level read
    alike)."""
    return _AREAS[min(len(_AREAS) - 1, max(0, int(noisy_difficulty * len(_AREAS))))]


def _prompt_text(rng: np.random.Generator, difficulty: float) -> str:
    area = hint_area(difficulty + rng.normal(0.0, 0.1))
    words = [str(w) for w in rng.choice(area, size=3)] + [str(w) for w in rng.choice(_FILLER, size=8)]
    rng.shuffle(words)
    return " ".join(words)


def _plan(rng: np.random.Generator, difficulty: float) -> tuple[list[int], list[str]]:
    turns = 1 + int(rng.poisson(1 + 9 * difficulty))
    mean_tokens = 60 + 360 * difficulty
    tokens = [max(1, int(rng.lognormal(math.log(mean_tokens), 0.45))) for _ in range(turns)]
    tests = 4 + int(rng.poisson(4 + 20 * difficulty))
    observations = []
    for i in range(turns - 1):
        failing = max(0, round(tests * (1 - (i + 1) / turns) + rng.normal(0, 1)))
        text = f"ran {tests} tests: {failing} failed"
        if rng.uniform() < 0.15 + 0.35 * difficulty:
            text += " Traceback error in " + str(rng.choice(_FILLER))
        observations.append(text)
    return tokens, observations


def _queries(
    prompt_id: str, prompt: str, tokens: list[int], observations: list[str], mates_totals: list[int]
) -> list[PredictionQuery]:
    messages: list[dict[str, str]] = [{"role": "user", "content": prompt}]
    queries = []
    generated = 0
    errors = 0
    for i, turn_tokens in enumerate(tokens):
        # Mates advance at the same token rate: a mate is done once it is shorter than this.
        done = [t for t in mates_totals if t <= generated]
        mates = {
            "total": len(mates_totals),
            "done": len(done),
            "done_mean_tokens": sum(done) / len(done) if done else 0.0,
            "mean_generated": sum(min(t, generated) for t in mates_totals) / len(mates_totals) if mates_totals else 0.0,
        }
        queries.append(query_from_messages(
            messages, generated_tokens=generated, tool_errors=errors, prompt_id=prompt_id, mates=mates,
        ))
        generated += turn_tokens
        messages = [*messages, {"role": "assistant", "content": f"<tool_call>step {i + 1}</tool_call>"}]
        if i < len(observations):
            errors += int("error" in observations[i].lower())
            messages.append({"role": "tool", "content": observations[i]})
    return queries
