"""A test environment whose every turn runs a command in its sandbox, so killing a sandbox
or a node agent mid-run hits a trajectory that is really using it."""

from __future__ import annotations

from typing import Any

from venusrl.env.base import Environment, Episode, StepResult


class SandboxTurnsEnv(Environment):
    needs_sandbox = True
    template = "base"
    continues_without_tool_call = True
    required_fields = ("turns",)

    def __init__(self) -> None:
        self.sandbox: Any = None
        self.turns_left = 0

    async def reset(self, row: dict[str, Any], sandbox: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.sandbox, self.turns_left = sandbox, int(row["turns"])
        result = await sandbox.run("echo ready")
        return [{"role": "user", "content": result.stdout.strip()}], []

    async def step(self, tool_calls: list[dict[str, Any]]) -> StepResult:
        return StepResult([{"role": "tool", "tool_call_id": c["id"], "content": "no tools"} for c in tool_calls])

    async def respond(self) -> StepResult | None:
        self.turns_left -= 1
        result = await self.sandbox.run("sleep 0.3; echo turn")
        if result.exit_code != 0:
            raise RuntimeError(f"sandbox command failed: {result.stderr.strip()}")
        return StepResult([{"role": "user", "content": result.stdout.strip()}], done=self.turns_left <= 0)

    def reward(self, episode: Episode) -> float:
        return float(len(episode.messages) % 3 == 0)

    @staticmethod
    def generate_dataset(count: int, seed: int = 0) -> list[dict[str, Any]]:
        return [{"id": f"s{seed}-{i}", "prompt": "go", "turns": 1 + (i + seed) % 3} for i in range(count)]
