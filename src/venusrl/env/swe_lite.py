"""`swe-lite`: a small generated Python repository with one planted bug and pytest tests that
catch it. Tools: `bash`, `read_file`, `write_file`, all inside the trajectory's sandbox.
Reward 1 when the repository's tests pass at the end.

`emit_images` packs the generated repositories as images (this host's Python and pytest
plus one layer per repository), so the `swe-image` environment's whole path, from image
import to pytest inside an image sandbox, runs without a network or a registry."""

from __future__ import annotations

import json
import random
import re
import shlex
import sys
import tempfile
from pathlib import Path
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


IMAGE_REPO = "/testbed"  # where SWE-bench images keep the repository
IMAGE_TEST_COMMAND = "python3 -m pytest -q -p no:cacheprovider"


def emit_images(rows: list[dict[str, Any]], store: str | Path, work: Path | None = None) -> list[dict[str, Any]]:
    """Import each row's repository as an image into `store` and return `swe-image` rows.
    All images share one base layer (this host's programs, Python and pytest), stored once."""
    from venusrl.sandbox.image.build import (
        PYTEST_PACKAGES,
        ImageSpec,
        LayerTar,
        host_rootfs,
        write_oci_layout,
    )
    from venusrl.sandbox.image.store import ImageStore

    with tempfile.TemporaryDirectory(prefix="swe-lite-images-", dir=work) as tmp:
        base = LayerTar.from_dir(host_rootfs(Path(tmp) / "rootfs", PYTEST_PACKAGES))
        images, out = {}, []
        for row in rows:
            repo = Path(tmp) / "repos" / row["id"]
            target = repo / IMAGE_REPO.lstrip("/")
            target.mkdir(parents=True)
            for name, content in row["files"].items():
                (target / name).write_text(content)
            name = f"swe-lite/{re.sub(r'[^A-Za-z0-9_.-]', '-', row['id'])}:latest"
            images[name] = ImageSpec([base, LayerTar.from_dir(repo)], env=["PATH=/usr/local/bin:/usr/bin:/bin"],
                                     working_dir=IMAGE_REPO, cmd=["/bin/bash"])
            out.append({"id": row["id"], "image": name, "repo": IMAGE_REPO, "prompt": row["prompt"],
                        "test_command": IMAGE_TEST_COMMAND})
        layout = write_oci_layout(images, Path(tmp) / "oci")
        store = ImageStore(store)
        for name in images:
            store.import_image(layout, ref=name)
    return out


class RepositoryTools:
    """`bash`, `read_file` and `write_file` in the repository at `self.repo` of the sandbox."""

    repo: str = REPO
    timeout_s: float = 60.0
    sandbox: Any = None

    async def step(self, tool_calls: list[dict[str, Any]]) -> StepResult:
        observations = []
        for call in tool_calls:
            arguments = json.loads(call["function"]["arguments"])
            name = call["function"]["name"]
            if name == "bash":
                result = await self.sandbox.run(arguments["cmd"], timeout=self.timeout_s, cwd=self.repo)
                text = f"exit code {result.exit_code}\n{result.stdout}{result.stderr}"
            elif name == "read_file":
                text = await self.sandbox.read(f"{self.repo}/{arguments['path']}")
            else:
                await self.sandbox.write(f"{self.repo}/{arguments['path']}", arguments["content"])
                text = f"wrote {arguments['path']}"
            observations.append({"role": "tool", "tool_call_id": call["id"], "content": text[-MAX_OUTPUT_CHARS:]})
        return StepResult(observations)


class SweLiteEnv(RepositoryTools, Environment):
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

    async def reward(self, episode: Episode) -> float:
        """1 when the repository's tests pass in the sandbox as the episode left it."""
        command = f"{shlex.quote(self.python)} -m pytest -q -p no:cacheprovider"
        result = await self.sandbox.run(command, timeout=self.timeout_s, cwd=REPO)
        return float(result.exit_code == 0)
