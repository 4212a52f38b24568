"""swe-lite: the planted bug really breaks the tests, and an agent that fixes it in the
sandbox is rewarded."""

import asyncio
import json
import subprocess
import sys

import pytest
from tests.rollout.scripted import Scripted
from tests.sandbox.cluster_helpers import MiB, make_cluster

from venusrl.env.swe_lite import _FUNCTIONS, SweLiteEnv, generate_dataset
from venusrl.model.chat import load_tokenizer
from venusrl.rollout.agent_loop import run_agent_loop
from venusrl.rollout.config import RolloutConfig
from venusrl.sandbox.api import AsyncSandbox


def fixed(module):
    for source, (right, wrong), _ in _FUNCTIONS:
        name = source.split("(")[0]
        if name in module and wrong in module:
            module = module.replace(wrong, right)
    return module


def run_pytest(directory):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=directory,
                          capture_output=True, text=True).returncode


def test_planted_bug_fails_the_tests_and_the_fix_passes(tmp_path):
    row = generate_dataset(1, seed=7)[0]
    for name, content in row["files"].items():
        (tmp_path / name).write_text(content)
    assert run_pytest(tmp_path) != 0
    (tmp_path / "utils.py").write_text(fixed(row["files"]["utils.py"]))
    assert run_pytest(tmp_path) == 0


@pytest.fixture(scope="module")
def cluster():
    c = make_cluster([1024 * MiB])
    yield c
    c.close()


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.mark.parametrize("fixes", [True, False])
def test_agent_that_fixes_the_bug_is_rewarded(cluster, tiny_model_dir, fixes):
    tokenizer = load_tokenizer(tiny_model_dir)
    row = generate_dataset(1, seed=7)[0]
    module = fixed(row["files"]["utils.py"]) if fixes else row["files"]["utils.py"]
    model = Scripted(tokenizer, [(call("bash", cmd="ls"), True), (call("write_file", path="utils.py", content=module), True),
                                 ("Fixed.", True)])

    async def main():
        sandbox = await AsyncSandbox.create(cluster.controller)
        try:
            return await run_agent_loop(SweLiteEnv(), row, model, tokenizer, RolloutConfig(), "swe-0", sandbox=sandbox)
        finally:
            await sandbox.kill()

    rollout = asyncio.run(main())
    listing = next(m for m in rollout.messages if m["role"] == "tool")["content"]
    assert "test_utils.py" in listing and "utils.py" in listing
    assert rollout.reward == (1.0 if fixes else 0.0)
