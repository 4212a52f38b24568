"""The python environment through the agent loop, with a real sandbox cluster."""

import asyncio
import json
import time

import pytest
from tests.rollout.scripted import Scripted
from tests.sandbox.cluster_helpers import MiB, make_cluster

from venusrl.env.python_exec import PythonEnv, generate_dataset
from venusrl.model.chat import load_tokenizer
from venusrl.rollout.agent_loop import run_agent_loop
from venusrl.rollout.config import RolloutConfig
from venusrl.sandbox.api import AsyncSandbox


@pytest.fixture(scope="module")
def cluster():
    c = make_cluster([1024 * MiB])
    yield c
    c.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def call(code):
    return "<tool_call>\n" + json.dumps({"name": "run_python", "arguments": {"code": code}}) + "\n</tool_call>"


def test_dataset_answers_are_what_python_computes():
    rows = generate_dataset(30, seed=3)
    assert len({r["prompt"].split()[0] for r in rows}) > 1
    assert all(isinstance(r["answer"], int) for r in rows)


def test_code_runs_in_the_sandbox_and_the_answer_is_rewarded(cluster, tokenizer):
    row = {"prompt": "What is 6 * 7?", "answer": 42}

    async def main():
        sandbox = await AsyncSandbox.create(cluster.controller)
        try:
            model = Scripted(tokenizer, [(call("print(6 * 7)"), True), ("Answer: 42", True)])
            return await run_agent_loop(PythonEnv(), row, model, tokenizer, RolloutConfig(), "py-0", sandbox=sandbox)
        finally:
            await sandbox.kill()

    rollout = asyncio.run(main())
    tool_message = next(m for m in rollout.messages if m["role"] == "tool")
    assert tool_message["content"].startswith("exit code 0\nstdout:\n42")
    assert rollout.reward == 1.0 and rollout.finish_reason == "done"


def test_a_sandbox_that_dies_mid_command_becomes_an_observation(cluster, tokenizer):
    row = {"prompt": "wait", "answer": 0}

    async def main():
        sandbox = await AsyncSandbox.create(cluster.controller)
        before = (await sandbox.metrics())["processes"]
        model = Scripted(tokenizer, [(call("import time\ntime.sleep(60)"), True), ("gave up", True)])
        loop = asyncio.create_task(run_agent_loop(PythonEnv(), row, model, tokenizer,
                                                  RolloutConfig(tool_timeout_s=30), "py-1", sandbox=sandbox))
        deadline = time.monotonic() + 30
        while (await sandbox.metrics())["processes"] <= before:  # until the tool's python runs in it
            assert time.monotonic() < deadline and not loop.done(), "the tool call never started"
            await asyncio.sleep(0.01)
        await sandbox.kill()
        return await asyncio.wait_for(loop, timeout=30)

    rollout = asyncio.run(main())
    tool_message = next(m for m in rollout.messages if m["role"] == "tool")
    assert tool_message["content"].startswith("error: ")
    assert rollout.turns[0].tool_errors == 1 and rollout.finish_reason == "done"


def test_python_env_without_a_sandbox_is_a_clear_error(tokenizer):
    with pytest.raises(ValueError, match="needs a sandbox"):
        asyncio.run(PythonEnv().reset({"prompt": "x", "answer": 1}))
