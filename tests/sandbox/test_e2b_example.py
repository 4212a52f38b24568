"""examples/e2b_agent: an agent loop written against e2b.Sandbox alone runs a tool-using
episode on venusrl's sandboxes, and the same loop runs as a venusrl environment."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("e2b", reason="the e2b SDK is in the dev extra")

pytestmark = pytest.mark.needs_root  # real sandboxes: see conftest.py

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "e2b_agent"


def test_the_agent_imports_nothing_of_venusrl():
    tree = ast.parse((EXAMPLE / "agent.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.startswith("venusrl") for name in imported), imported
    assert "e2b" in imported


def test_the_agent_solves_its_episode_through_the_e2b_api(e2b_service):
    env = {**os.environ, "PYTHONPATH": ""}  # the agent needs only the e2b SDK and the E2B_* variables
    done = subprocess.run([sys.executable, str(EXAMPLE / "agent.py"), "--limit", "2000"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {**report, "solved": True, "answer": 303, "tool_calls": 2, "turns": 3}


def test_the_same_loop_as_a_venusrl_environment(e2b_service):
    from examples.e2b_agent.agent import scripted_policy
    from examples.e2b_agent.env import E2BAgentEnv

    from venusrl.env.base import Episode
    from venusrl.env.registry import environment_factory

    env_class = environment_factory("examples.e2b_agent.env:E2BAgentEnv")
    assert env_class is E2BAgentEnv
    (row,) = E2BAgentEnv.generate_dataset(1, seed=3)

    async def episode() -> float:
        env = env_class()
        messages, tools = await env.reset(row)
        assert [t["function"]["name"] for t in tools] == ["write_file", "run_shell", "read_file"]
        while True:
            reply = scripted_policy(messages)
            messages.append(reply)
            if not reply.get("tool_calls"):
                break
            messages.extend((await env.step(reply["tool_calls"])).observations)
        sandbox_id = env.sandbox.sandbox_id
        reward = await env.reward(Episode(row, messages, "stop", tool_calls=2))
        assert sandbox_id not in e2b_service.service.controller.routes  # released with the episode
        return reward

    assert asyncio.run(episode()) == 1.0
