"""`python`: problems with a checkable numeric answer and a `run_python` tool that executes
code in the trajectory's sandbox. Reward 1 for a final 'Answer: N' equal to the row's."""

from __future__ import annotations

import json
import random
from typing import Any

from venusrl.env.base import Environment, Episode, StepResult
from venusrl.env.calculator import final_answer_matches

RUN_PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "run_python",
        "description": "Run a Python 3 program in the sandbox and return its exit code, stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string"}},
            "required": ["code"],
        },
    },
}
SYSTEM_PROMPT = "Write and run Python with run_python to solve the problem. When done, reply with 'Answer: <number>'."
MAX_OUTPUT_CHARS = 2000


def _fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _primes_below(n: int) -> int:
    return sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, n))


_PROBLEMS = [
    (lambda r: r.randint(20, 80), "What is the {x}-th Fibonacci number (F(0)=0, F(1)=1)?", _fibonacci),
    (lambda r: r.randint(100, 5000), "How many primes are there below {x}?", _primes_below),
    (lambda r: r.randint(100, 10000), "What is the sum of the digits of 2**{x}?", lambda x: sum(map(int, str(2**x)))),
]


def generate_dataset(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        draw, template, solve = _PROBLEMS[rng.randrange(len(_PROBLEMS))]
        x = draw(rng)
        rows.append({"id": f"py-{seed}-{i}", "prompt": template.format(x=x), "answer": solve(x)})
    return rows


class PythonEnv(Environment):
    needs_sandbox = True
    template = "base"
    required_fields = ("prompt", "answer")

    def __init__(self, timeout_s: float = 20.0) -> None:
        self.timeout_s = timeout_s
        self.sandbox: Any = None

    async def reset(self, row: dict[str, Any], sandbox: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.check_row(row)
        if sandbox is None:
            raise ValueError("the python environment needs a sandbox (an AsyncSandbox)")
        self.sandbox = sandbox
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["prompt"]}]
        return messages, [RUN_PYTHON_TOOL]

    async def step(self, tool_calls: list[dict[str, Any]]) -> StepResult:
        observations = []
        for call in tool_calls:
            code = json.loads(call["function"]["arguments"])["code"]
            await self.sandbox.write("/workspace/main.py", code)
            result = await self.sandbox.run("python3 /workspace/main.py", timeout=self.timeout_s, cwd="/workspace")
            text = f"exit code {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            if result.timed_out:
                text = f"timed out after {self.timeout_s:g}s\n" + text
            observations.append({"role": "tool", "tool_call_id": call["id"], "content": text[-MAX_OUTPUT_CHARS:]})
        return StepResult(observations)

    def reward(self, episode: Episode) -> float:
        return float(final_answer_matches(episode))
