"""SWE-agent-like trajectories: what each turn generates, what the tool returns, how long the
tool takes. Drawn from `WorkloadConfig` (a YAML file under examples/sim/) or replayed from a
recorded trace (`venusrl.trace`: JSONL, one row per turn).

Per prompt a difficulty d ~ Beta(a, b), shared by the K trajectories of its group; each
trajectory draws its own number of turns and turn lengths around medians that grow with d
(sampling temperature makes siblings differ). Lengths are log-normal; a trajectory stops at
`max_turns` or when its context would pass `max_total_tokens` (its last turn is cut there).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import yaml
from pydantic import Field

from venusrl.schema import Section
from venusrl.trace import TrajectoryPlan, TurnPlan, read_trace


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
