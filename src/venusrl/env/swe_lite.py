"""`swe-lite`: a small generated Python repository with one planted bug and pytest tests that
catch it. Tools: `bash`, `read_file`, `write_file`, all inside the trajectory's sandbox.
Reward 1 when the repository's tests pass at the end."""

from __future__ import annotations

import json
import random
import shlex
import sys
from typing import Any

from venusrl.env.base import Environment, Episode, StepResult

REPO = "/workspace/repo"
MAX_OUTPUT_CHARS = 4000
TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command in the repository.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Replace a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
]
SYSTEM_PROMPT = f"You fix bugs in the Python repository at {REPO}. Its tests run with `python -m pytest -q`."

# (function source, the planted bug as (correct text, buggy text), test source)
_FUNCTIONS = [
    ("def clamp(x, low, high):\n    return max(low, min(x, high))\n", ("min(x, high)", "min(x, low)"),
     "def test_clamp():\n    assert clamp(5, 0, 3) == 3\n    assert clamp(-1, 0, 3) == 0\n    assert clamp(2, 0, 3) == 2\n"),
    ("def mean(values):\n    return sum(values) / len(values)\n", ("/ len(values)", "/ (len(values) + 1)"),
     "def test_mean():\n    assert mean([1, 2, 3]) == 2\n"),
    ("def is_palindrome(text):\n    return text == text[::-1]\n", ("text[::-1]", "text[1:]"),
     "def test_is_palindrome():\n    assert is_palindrome('abba')\n    assert not is_palindrome('abc')\n"),
    ("def count_vowels(text):\n    return sum(ch in 'aeiou' for ch in text.lower())\n", ("text.lower()", "text.upper()"),
     "def test_count_vowels():\n    assert count_vowels('Banana') == 3\n"),
    ("def last(items, n):\n    return items[-n:] if n else []\n", ("items[-n:]", "items[-n - 1:]"),
     "def test_last():\n    assert last([1, 2, 3, 4], 2) == [3, 4]\n    assert last([1], 0) == []\n"),
]


def generate_dataset(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Each row: a module of 3 functions (one with a planted bug) and their tests."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        chosen = rng.sample(range(len(_FUNCTIONS)), 3)
        buggy = rng.choice(chosen)
        module = "\n\n".join(
            _FUNCTIONS[j][0].replace(*_FUNCTIONS[j][1]) if j == buggy else _FUNCTIONS[j][0] for j in chosen
        )
        names = [_FUNCTIONS[j][0].split("(")[0].removeprefix("def ") for j in chosen]
        tests = f"from utils import {', '.join(names)}\n\n\n" + "\n\n".join(_FUNCTIONS[j][2] for j in chosen)
        rows.append({"id": f"swe-{seed}-{i}", "prompt": "The tests of this repository fail. Find the bug and fix it.",
                     "files": {"utils.py": module, "test_utils.py": tests}})
    return rows


class SweLiteEnv(Environment):
    needs_sandbox = True
    template = "base"
    required_fields = ("prompt", "files")

    def __init__(self, timeout_s: float = 60.0, python: str = sys.executable) -> None:
        # the host interpreter (and its pytest) is mounted read-only inside the sandbox
        self.timeout_s, self.python = timeout_s, python
        self.sandbox: Any = None

    async def reset(self, row: dict[str, Any], sandbox: Any = None):
        self.check_row(row)
        if sandbox is None:
            raise ValueError("the swe-lite environment needs a sandbox (an AsyncSandbox)")
        self.sandbox = sandbox
        for path, content in row["files"].items():
            await sandbox.write(f"{REPO}/{path}", content)
        listing = "\n".join(sorted(row["files"]))
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": f"{row['prompt']}\nFiles:\n{listing}"}]
        return messages, TOOLS

    async def step(self, tool_calls: list[dict[str, Any]]) -> StepResult:
        observations = []
        for call in tool_calls:
            arguments = json.loads(call["function"]["arguments"])
            name = call["function"]["name"]
            if name == "bash":
                result = await self.sandbox.run(arguments["cmd"], timeout=self.timeout_s, cwd=REPO)
                text = f"exit code {result.exit_code}\n{result.stdout}{result.stderr}"
            elif name == "read_file":
                text = await self.sandbox.read(f"{REPO}/{arguments['path']}")
            else:
                await self.sandbox.write(f"{REPO}/{arguments['path']}", arguments["content"])
                text = f"wrote {arguments['path']}"
            observations.append({"role": "tool", "tool_call_id": call["id"], "content": text[-MAX_OUTPUT_CHARS:]})
        return StepResult(observations)

    async def reward(self, episode: Episode) -> float:
        """1 when the repository's tests pass in the sandbox as the episode left it."""
        command = f"{shlex.quote(self.python)} -m pytest -q -p no:cacheprovider"
        result = await self.sandbox.run(command, timeout=self.timeout_s, cwd=REPO)
        return float(result.exit_code == 0)
