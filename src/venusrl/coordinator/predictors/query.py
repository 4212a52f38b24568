"""What a length predictor sees at a turn boundary, and the (query, remaining) examples it
learns from."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from venusrl.types import Group, Trajectory, TrajectoryStatus

# When a (messages, remaining_tokens) row does not say how many tokens were generated, they are
# estimated from the assistant text at about four characters per token.
CHARS_PER_TOKEN = 4


@dataclass(slots=True, frozen=True)
class PredictionQuery:
    """A trajectory at a turn boundary: the prompt, its history so far and its group mates."""

    prompt_id: str
    prompt_text: str
    last_observation: str  # the latest tool output (or user reply); "" before the first turn
    turns: int  # turns generated so far
    generated_tokens: int
    tool_errors: int = 0
    mates_total: int = 0  # other trajectories in the group
    mates_done: int = 0
    mates_done_mean_tokens: float = 0.0  # mean length of the mates already done
    mates_mean_generated: float = 0.0  # mean tokens generated so far by all mates
    messages: tuple[dict[str, Any], ...] = field(default=(), compare=False)  # full chat (lm)
    trajectory_id: int = -1


@dataclass(slots=True, frozen=True)
class Example:
    query: PredictionQuery
    remaining_tokens: int


def prompt_text_of(messages: Sequence[dict[str, Any]]) -> str:
    """The content of the messages before the first assistant turn."""
    parts = []
    for message in messages:
        if message.get("role") == "assistant":
            break
        parts.append(message.get("content") or "")
    return "\n".join(parts)


def stable_prompt_id(prompt_text: str) -> str:
    return f"{zlib.crc32(prompt_text.encode()):08x}"


def query_from_messages(
    messages: Sequence[dict[str, Any]],
    *,
    generated_tokens: int | None = None,
    tool_errors: int | None = None,
    prompt_id: str | None = None,
    mates: dict[str, float] | None = None,
    trajectory_id: int = -1,
) -> PredictionQuery:
    """A query from a chat transcript, the paper's (messages, length) form."""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    prompt_text = prompt_text_of(messages)
    last = messages[-1] if messages else {}
    last_observation = (last.get("content") or "") if assistant and last.get("role") != "assistant" else ""
    if generated_tokens is None:
        chars = sum(len(m.get("content") or "") for m in assistant)
        generated_tokens = -(-chars // CHARS_PER_TOKEN)
    if tool_errors is None:
        tool_errors = sum(
            1 for m in messages if m.get("role") == "tool" and "error" in (m.get("content") or "").lower()
        )
    mates = mates or {}
    return PredictionQuery(
        prompt_id=prompt_id if prompt_id is not None else stable_prompt_id(prompt_text),
        prompt_text=prompt_text,
        last_observation=last_observation,
        turns=len(assistant),
        generated_tokens=generated_tokens,
        tool_errors=tool_errors,
        mates_total=int(mates.get("total", 0)),
        mates_done=int(mates.get("done", 0)),
        mates_done_mean_tokens=float(mates.get("done_mean_tokens", 0.0)),
        mates_mean_generated=float(mates.get("mean_generated", 0.0)),
        messages=tuple(messages),
        trajectory_id=trajectory_id,
    )


def query_from_trajectory(
    trajectory: Trajectory,
    group: Group,
    *,
    messages: Sequence[dict[str, Any]] = (),
    last_observation: str = "",
) -> PredictionQuery:
    """A query for a live trajectory of the coordinator; the worker supplies the chat so far."""
    mates = [t for t in group.trajectories if t.id != trajectory.id]
    done = [t.generated_tokens for t in mates if t.status is TrajectoryStatus.DONE]
    return PredictionQuery(
        prompt_id=trajectory.prompt.id,
        prompt_text=prompt_text_of(trajectory.prompt.messages),
        last_observation=last_observation,
        turns=len(trajectory.turns),
        generated_tokens=trajectory.generated_tokens,
        tool_errors=trajectory.tool_errors,
        mates_total=len(mates),
        mates_done=len(done),
        mates_done_mean_tokens=sum(done) / len(done) if done else 0.0,
        mates_mean_generated=sum(t.generated_tokens for t in mates) / len(mates) if mates else 0.0,
        messages=tuple(messages) or tuple(trajectory.prompt.messages),
        trajectory_id=trajectory.id,
    )


def examples_of_finished(queries: Sequence[PredictionQuery], total_generated: int) -> list[Example]:
    """The training examples of one finished trajectory: each boundary's query with the tokens
    that were still to come after it."""
    return [Example(q, max(0, total_generated - q.generated_tokens)) for q in queries]
