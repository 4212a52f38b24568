"""The rollout bench's workload: agent tasks whose length the prompt does not state.

Each task has a latent difficulty d ~ Uniform(0, 1), shared by the K trajectories of its
group. A trajectory's number of turns is log-normal around a median that grows with d,

    turns ~ round(LogNormal(log(median(d)), TURNS_SIGMA)), clamped to 1..max_turns,
    median(d) = TURNS_EASY * (max_turns / TURNS_EASY) ** d,

drawn per trajectory (sampling temperature makes group mates differ). The prompt shows d
only through a noisy hint: three words of the vocabulary level of d + N(0, HINT_NOISE)
(`synthetic.hint_area`) in a fixed sentence, so prompts of one level read alike whatever
their difficulty, and two prompts with the same text take different numbers of turns. After
every turn the environment answers, after a tool latency ~ Exponential(mean
`latency_mean_s`), with test results: `tests` = 4 + Poisson(4 + 20 d) of which the failing
ones fall towards 0 as the trajectory nears its end, with noise. With `log_lines` > 0 the
answer also lists up to that many failing tests, one line each (a test runner's report), so
a context grows by its observations as a coding agent's does and KV, not slots, can bind. A
predictor can learn from the hint, the test counts and the group mates that finished, not
read the answer.

The random tiny model's text is not the point: its turns cost real forward passes and KV.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from venusrl.coordinator.predictors.synthetic import hint_area
from venusrl.env.base import Environment, Episode, StepResult
from venusrl.types import Prompt

TURNS_EASY = 1.5  # median turns at difficulty 0
TURNS_SIGMA = 0.35  # log-normal spread of turns within a group
HINT_NOISE = 0.25  # standard deviation of the hint's difficulty, in units of d
SYSTEM_PROMPT = "You are a coding agent. Call the run_tests tool after every change until the tests pass."
RUN_TESTS_TOOL = {
    "type": "function",
    "function": {
        "name": "run_tests",
        "description": "Run the test suite of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []},
    },
}


@dataclass(slots=True, frozen=True)
class EpisodePlan:
    """What one trajectory of a task will meet: its turns, its test suite and the latency
    of each environment answer."""

    turns: int
    tests: int
    latencies_s: tuple[float, ...]  # after each turn but the last


def make_tasks(count: int, seed: int, max_turns: int, latency_mean_s: float, log_lines: int = 0) -> list[Prompt]:
    """`count` tasks; the row carries what the environment needs (difficulty among it), the
    messages only the hint sentence; `log_lines`: failing tests each answer lists."""
    rng = random.Random(f"tasks-{seed}")
    tasks = []
    for i in range(count):
        difficulty = rng.random()
        area = hint_area(difficulty + rng.gauss(0.0, HINT_NOISE))
        words = " ".join(rng.choice(area) for _ in range(3))
        text = f"Fix the failing tests: the {words} code is broken."
        task_id = f"task-{seed}-{i}"
        tasks.append(Prompt(id=task_id, messages=({"role": "user", "content": text},),
                            metadata={"id": task_id, "difficulty": difficulty, "max_turns": max_turns,
                                      "latency_mean_s": latency_mean_s, "log_lines": log_lines}))
    return tasks


def median_turns(difficulty: float, max_turns: int) -> float:
    return TURNS_EASY * (max_turns / TURNS_EASY) ** difficulty


def plan_episode(row: dict[str, Any], episode: int) -> EpisodePlan:
    """The `episode`-th trajectory of the task in `row`, deterministic in (task, episode)."""
    rng = random.Random(f"{row['id']}-{episode}")
    d, max_turns = row["difficulty"], row["max_turns"]
    drawn = round(rng.lognormvariate(math.log(median_turns(d, max_turns)), TURNS_SIGMA))
    turns = min(max_turns, max(1, drawn))
    tests = 4 + _poisson(rng, 4 + 20 * d)
    latencies = tuple(rng.expovariate(1.0 / row["latency_mean_s"]) for _ in range(turns - 1))
    return EpisodePlan(turns, tests, latencies)


def failing_tests(plan: EpisodePlan, turns_done: int, rng: random.Random) -> int:
    """Failing tests after `turns_done` turns: the suite's share of the turns still to come,
    with noise."""
    left = plan.turns - turns_done
    return max(0, round(plan.tests * left / plan.turns + rng.gauss(0.0, 1.0)))


def failure_lines(plan: EpisodePlan, failing: int, limit: int, rng: random.Random) -> list[str]:
    """The test runner's report of up to `limit` of the `failing` tests, one line each."""
    return [f"FAILED tests/test_module_{rng.randrange(plan.tests)}.py::test_case_{rng.randrange(100)} - "
            f"AssertionError: expected {rng.randrange(1000)}, got {rng.randrange(1000)}"
            for _ in range(min(failing, limit))]


class AgentTaskEnv(Environment):
    """Answers every turn (tool call or not) after its latency with test results until the
    episode's turns are used up. The n-th episode of a task in a round (`episodes`, shared
    by the round's environments) follows plan (task, n), so every scheduling mode meets the
    same draws."""

    continues_without_tool_call = True
    required_fields = ("id", "difficulty", "max_turns", "latency_mean_s")

    def __init__(self, episodes: Counter[str]) -> None:
        self.episodes = episodes
        self.plan = EpisodePlan(1, 1, ())
        self.turns_done = 0
        self.log_lines = 0
        self.rng = random.Random()

    async def reset(self, row: dict[str, Any], sandbox: Any = None):
        self.check_row(row)
        self.plan = plan_episode(row, self.episodes[row["id"]])
        self.rng.seed(f"{row['id']}-{self.episodes[row['id']]}-tests")
        self.episodes[row["id"]] += 1
        self.turns_done = 0
        self.log_lines = row.get("log_lines", 0)
        return [{"role": "system", "content": SYSTEM_PROMPT}, *row["messages"]], [RUN_TESTS_TOOL]

    async def _answer(self, wrap) -> StepResult:
        self.turns_done += 1
        if self.turns_done >= self.plan.turns:
            return StepResult(wrap("all tests passed"), done=True)
        await asyncio.sleep(self.plan.latencies_s[self.turns_done - 1])
        failing = failing_tests(self.plan, self.turns_done, self.rng)
        report = [f"ran {self.plan.tests} tests: {failing} failed",
                  *failure_lines(self.plan, failing, self.log_lines, self.rng)]
        return StepResult(wrap("\n".join(report)))

    async def step(self, tool_calls):
        return await self._answer(lambda text: [{"role": "tool", "tool_call_id": c["id"], "content": text}
                                                for c in tool_calls])

    async def respond(self):
        return await self._answer(lambda text: [{"role": "user", "content": text}])

    def reward(self, episode: Episode) -> float:
        return 0.0


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method (means here are below 30)."""
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k
