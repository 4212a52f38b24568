"""The agent loop of agent.py as a venusrl environment: the same tools, run by the same
`run_tool` through the e2b SDK, so a policy trained here acts through exactly the code it
will run with in the field. Each trajectory makes its own E2B sandbox (on whatever the
E2B_* variables point at: venusrl's own `sandbox serve --e2b`, or E2B's cloud), so venusrl
does not hand it one (`needs_sandbox = False`).

    env: {name: "examples.e2b_agent.env:E2BAgentEnv"}   # in a venusrl config
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from e2b import Sandbox
from examples.e2b_agent.agent import (
    MAX_OBSERVATION_CHARS,
    SYSTEM_PROMPT,
    TOOLS,
    final_answer,
    run_tool,
    task,
)

from venusrl.env.base import Environment, Episode, StepResult


class E2BAgentEnv(Environment):
    required_fields = ("prompt", "answer")

    def __init__(self, template: str = "base") -> None:
        self.e2b_template = template
        self.sandbox: Sandbox | None = None

    @staticmethod
    def generate_dataset(count: int, seed: int = 0) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        return [{"id": f"e2b-{seed}-{i}", **task(rng.randint(100, 5000))} for i in range(count)]

    async def reset(self, row: dict[str, Any], sandbox: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.check_row(row)
        self.sandbox = await asyncio.to_thread(Sandbox.create, self.e2b_template)
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["prompt"]}], TOOLS

    async def step(self, tool_calls: list[dict[str, Any]]) -> StepResult:
        observations = []
        for call in tool_calls:
            output = await asyncio.to_thread(run_tool, self.sandbox, call["function"]["name"],
                                             json.loads(call["function"]["arguments"]))
            observations.append({"role": "tool", "tool_call_id": call["id"], "content": output[-MAX_OBSERVATION_CHARS:]})
        return StepResult(observations)

    async def reward(self, episode: Episode) -> float:
        """1 for the right final answer; the episode's sandbox is released here, its last use."""
        if self.sandbox is not None:
            await asyncio.to_thread(self.sandbox.kill)
            self.sandbox = None
        return float(final_answer(episode.messages) == episode.row["answer"])
