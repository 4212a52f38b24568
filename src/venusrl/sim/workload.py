"""SWE-agent-like trajectories: what each turn generates, what the tool returns, how long the
tool takes. Drawn from `WorkloadConfig` (a YAML file under examples/sim/) or replayed from a
recorded trace (JSONL, one row per turn).

Per prompt a difficulty d ~ Beta(a, b), shared by the K trajectories of its group; each
trajectory draws its own number of turns and turn lengths around medians that grow with d
(sampling temperature makes siblings differ). Lengths are log-normal; a trajectory stops at
`max_turns` or when its context would pass `max_total_tokens` (its last turn is cut there).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from venusrl.schema import Section
from venusrl.types import Group


class WorkloadConfig(Section):
    group_size: int = Field(8, ge=1, description="K")
    difficulty_alpha: float = Field(1.2, gt=0)
    difficulty_beta: float = Field(2.0, gt=0)
    turns_median_easy: float = Field(15.0, gt=0, description="median turns at difficulty 0")
    turns_median_hard: float = Field(90.0, gt=0, description="median turns at difficulty 1")
    turns_sigma: float = Field(0.5, ge=0, description="log-normal spread of turns within a group")
    max_turns: int = Field(300, ge=1)
    gen_tokens_median_easy: float = Field(250.0, gt=0, description="median generated tokens per turn at difficulty 0")
    gen_tokens_median_hard: float = Field(600.0, gt=0)
    gen_tokens_sigma: float = Field(0.6, ge=0)
    obs_tokens_median: float = Field(400.0, ge=0, description="median tool observation tokens")
    obs_tokens_sigma: float = Field(1.0, ge=0)
    prompt_tokens_median: float = Field(3000.0, gt=0)
    prompt_tokens_sigma: float = Field(0.3, ge=0)
    shared_prompt_tokens: int = Field(
        0, ge=0, description="leading prompt tokens every prompt shares (system prompt, tool schemas); part of prompt_tokens")
    max_total_tokens: int = Field(131072, ge=16, description="prompt + every turn and observation")
    tool_seconds_median: float = Field(3.0, ge=0)
    tool_seconds_sigma: float = Field(1.0, ge=0)
    trace: str | None = Field(None, description="JSONL of recorded turns to replay instead of drawing")


@dataclass(slots=True, frozen=True)
class TurnPlan:
    gen_tokens: int
    obs_tokens: int  # 0 after the last turn
    tool_seconds: float  # after the last turn: 0, or a final tool call that ends the episode


@dataclass(slots=True, frozen=True)
class TrajectoryPlan:
    prompt_tokens: int
    turns: tuple[TurnPlan, ...]
    shared_prompt_tokens: int = 0  # the first of prompt_tokens, the same in every prompt

    @property
    def gen_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)

    def remaining_gen_tokens(self, turns_done: int, tokens_into_turn: int = 0) -> int:
        return sum(t.gen_tokens for t in self.turns[turns_done:]) - tokens_into_turn


def load_workload(path: str | Path) -> WorkloadConfig:
    return WorkloadConfig.model_validate(yaml.safe_load(Path(path).read_text()) or {})


class Workload:
    """Plans by (prompt index, trajectory index, attempt); deterministic in `seed`."""

    def __init__(self, config: WorkloadConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed
        self._trace = read_trace(config.trace) if config.trace else None
        self._difficulty: dict[int, float] = {}

    @property
    def group_size(self) -> int:
        return len(self._trace[0]) if self._trace else self.config.group_size

    def prompt_tokens(self, prompt: int) -> tuple[int, int]:
        """(tokens of the prompt, how many of its first tokens every prompt shares)."""
        plan = self.plan(prompt, 0, 0)
        return plan.prompt_tokens, plan.shared_prompt_tokens

    def difficulty(self, prompt: int) -> float:
        if prompt not in self._difficulty:
            c = self.config
            self._difficulty[prompt] = random.Random(f"{self.seed}-d-{prompt}").betavariate(
                c.difficulty_alpha, c.difficulty_beta
            )
        return self._difficulty[prompt]

    def plan(self, prompt: int, index: int, attempt: int) -> TrajectoryPlan:
        if self._trace is not None:
            group = self._trace[prompt % len(self._trace)]
            return group[index % len(group)]
        c = self.config
        d = self.difficulty(prompt)
        prompt_rng = random.Random(f"{self.seed}-p-{prompt}")
        prompt_tokens = max(1, round(prompt_rng.lognormvariate(math.log(c.prompt_tokens_median), c.prompt_tokens_sigma)))
        rng = random.Random(f"{self.seed}-t-{prompt}-{index}-{attempt}")
        turns_median = _between(c.turns_median_easy, c.turns_median_hard, d)
        gen_median = _between(c.gen_tokens_median_easy, c.gen_tokens_median_hard, d)
        num_turns = min(c.max_turns, max(1, round(rng.lognormvariate(math.log(turns_median), c.turns_sigma))))
        turns: list[TurnPlan] = []
        context = prompt_tokens
        for turn in range(num_turns):
            gen = max(1, round(rng.lognormvariate(math.log(gen_median), c.gen_tokens_sigma)))
            gen = min(gen, c.max_total_tokens - context)
            context += gen
            last = turn == num_turns - 1 or gen <= 0
            obs = 0 if last else round(_lognormal(rng, c.obs_tokens_median, c.obs_tokens_sigma))
            if not last and context + obs + 1 >= c.max_total_tokens:
                last, obs = True, 0
            tool = 0.0 if last else _lognormal(rng, c.tool_seconds_median, c.tool_seconds_sigma)
            if gen > 0:
                turns.append(TurnPlan(gen, obs, tool))
            context += obs
            if last:
                break
        if turns and turns[-1].obs_tokens:  # the cap cut the trajectory after a tool call
            turns[-1] = TurnPlan(turns[-1].gen_tokens, 0, 0.0)
        return TrajectoryPlan(prompt_tokens, tuple(turns) or (TurnPlan(1, 0, 0.0),),
                              min(prompt_tokens, c.shared_prompt_tokens))


def _between(easy: float, hard: float, d: float) -> float:
    """Geometric interpolation: difficulty scales lengths multiplicatively."""
    return easy * (hard / easy) ** d


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return 0.0 if median <= 0 else rng.lognormvariate(math.log(median), sigma)


def read_trace(path: str | Path) -> list[list[TrajectoryPlan]]:
    """Groups of plans from a JSONL trace: rows {"prompt", "index", "turn", "prompt_tokens",
    "gen_tokens", "obs_tokens", "tool_seconds", "shared_prompt_tokens"} (the last three
    optional); turns of one (prompt, index) in turn order."""
    rows: dict[str, dict[int, list[dict]]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = {"prompt", "index", "turn", "prompt_tokens", "gen_tokens"} - row.keys()
        if missing:
            raise ValueError(f"{path}:{number}: missing {', '.join(sorted(missing))}")
        rows.setdefault(str(row["prompt"]), {}).setdefault(int(row["index"]), []).append(row)
    if not rows:
        raise ValueError(f"{path}: no turns")
    groups = []
    for by_index in rows.values():
        group = []
        for index in sorted(by_index):
            turns = sorted(by_index[index], key=lambda r: r["turn"])
            plans = tuple(TurnPlan(int(t["gen_tokens"]), int(t.get("obs_tokens", 0)), float(t.get("tool_seconds", 0.0)))
                          for t in turns)
            last = plans[-1]  # a final tool call (the environment ending it) keeps its time
            plans = (*plans[:-1], TurnPlan(last.gen_tokens, 0, last.tool_seconds))
            prompt_tokens = int(turns[0]["prompt_tokens"])
            shared = min(prompt_tokens, int(turns[0].get("shared_prompt_tokens", 0)))
            group.append(TrajectoryPlan(prompt_tokens, plans, shared))
        groups.append(group)
    return groups


def recorded_trace(groups: Iterable[Group]) -> list[dict[str, Any]]:
    """A run's turns as trace rows (`read_trace`'s format), in the groups' admission order:
    each trajectory's current attempt, as far as it got. `shared_prompt_tokens` is the
    prefix every recorded prompt shares (the system prompt and tool schemas of a dataset),
    read from the finished trajectories' records (an unfinished one has only its counts)."""
    trajectories = [(group, t) for group in sorted(groups, key=lambda g: g.seq) for t in group.trajectories if t.turns]
    prompts = [t.token_ids[: t.turns[0].context_tokens] for _, t in trajectories if t.token_ids]
    shared = shared_prefix_length(prompts) if prompts else 0
    rows = []
    for group, t in trajectories:
        for number, turn in enumerate(t.turns):
            following = t.turns[number + 1].context_tokens if number + 1 < len(t.turns) else 0
            rows.append({"prompt": group.prompt.id, "index": t.index, "turn": number,
                         "prompt_tokens": t.turns[0].context_tokens,
                         "shared_prompt_tokens": shared, "gen_tokens": turn.generated_tokens,
                         "obs_tokens": following, "tool_seconds": turn.tool_seconds or 0.0})
    return rows


def shared_prefix_length(sequences: list[list[int]]) -> int:
    """How many leading tokens all `sequences` share (a whole sequence, if it is a prefix of
    the rest; the trainer's `common_prefix_length` leaves each one token of its own)."""
    first = sequences[0]
    return min(next((i for i, (x, y) in enumerate(zip(first, other, strict=False)) if x != y),
                    min(len(first), len(other))) for other in sequences)


def coarsened(config: WorkloadConfig, factor: float) -> WorkloadConfig:
    """Fewer, longer turns with the same tokens and tool time per trajectory: `factor`
    times fewer turns, each `factor` times longer (for quick runs; the radix tree and the
    event count shrink with the turns)."""
    if factor == 1:
        return config
    return config.model_copy(update={
        "turns_median_easy": config.turns_median_easy / factor,
        "turns_median_hard": config.turns_median_hard / factor,
        "max_turns": max(1, round(config.max_turns / factor)),
        "gen_tokens_median_easy": config.gen_tokens_median_easy * factor,
        "gen_tokens_median_hard": config.gen_tokens_median_hard * factor,
        "obs_tokens_median": config.obs_tokens_median * factor,
        "tool_seconds_median": config.tool_seconds_median * factor,
    })
