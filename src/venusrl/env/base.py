"""The environment protocol. One instance serves one trajectory (it may keep state)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any


class DatasetRowError(ValueError):
    """A dataset row lacks a field the environment needs; names the row and the field."""


@dataclass(slots=True)
class StepResult:
    observations: list[dict[str, Any]]  # messages to append: role "tool" (with tool_call_id) or "user"
    done: bool = False


@dataclass(slots=True)
class Episode:
    """What an environment sees of a finished trajectory when it scores it."""

    row: dict[str, Any]
    messages: list[dict[str, Any]]
    finish_reason: str
    tool_calls: int = 0
    tool_errors: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Environment(ABC):
    """`reset` gives the opening messages and OpenAI tool schemas; `step` runs the turn's
    well-formed tool calls; `reward` scores the episode. Environments that need a sandbox say
    so and name the template; the rollout worker creates it and passes it to `reset`."""

    needs_sandbox: bool = False
    template: str | None = None
    required_fields: tuple[str, ...] = ()
    continues_without_tool_call: bool = False  # True for user simulators (see `respond`)

    def sandbox_template(self, row: dict[str, Any]) -> Any:
        """The template (a name or a `Template`) of this row's sandbox: the class's
        `template` unless the environment picks one per row (an image per task, say)."""
        return self.template or "base"

    def check_row(self, row: dict[str, Any], where: str = "row") -> None:
        missing = [name for name in self.required_fields if name not in row]
        if missing:
            raise DatasetRowError(f"{where}: missing field(s) {', '.join(missing)} needed by {type(self).__name__}")

    @abstractmethod
    async def reset(self, row: dict[str, Any], sandbox: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ...

    @abstractmethod
    async def step(self, tool_calls: list[dict[str, Any]]) -> StepResult:
        ...

    @abstractmethod
    def reward(self, episode: Episode) -> float | Awaitable[float]:
        """Sync, or async when scoring needs the sandbox (running the tests, say)."""

    async def respond(self) -> StepResult | None:
        """Called when the model's turn has no tool call. None (the default) ends the episode:
        the turn was the final answer. A user simulator returns its next message instead."""
        return None
