"""The trace format: a rollout's turns as JSONL rows, one per turn, below both what records it
(`venusrl bench rollout --json`, `recorded_trace`) and what replays it (the simulator's
workload, `read_trace`).

A row: {"prompt", "index", "turn", "prompt_tokens", "gen_tokens"} and optionally
{"obs_tokens", "tool_seconds", "shared_prompt_tokens"}: the `index`-th trajectory of the group
of `prompt`, its `turn`-th assistant turn, the prompt's length (the first
`shared_prompt_tokens` of it the same in every prompt), the tokens the turn generated, the
observation that followed it and how long its tool ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from venusrl.coordinator.dataset import jsonl_objects
from venusrl.types import Group


@dataclass(slots=True, frozen=True)
class TurnPlan:
    gen_tokens: int
    obs_tokens: int  # 0 after the last turn
    tool_seconds: float  # after the last turn: 0, or a final tool call that ends the episode


@dataclass(slots=True, frozen=True)
class TrajectoryPlan:
    prompt_tokens: int
    turns: tuple[TurnPlan, ...]
    shared_prompt_tokens: int = 0  # the first of prompt_tokens, the same in every prompt

    @property
    def gen_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)

    def remaining_gen_tokens(self, turns_done: int, tokens_into_turn: int = 0) -> int:
        return sum(t.gen_tokens for t in self.turns[turns_done:]) - tokens_into_turn


def read_trace(path: str | Path) -> list[list[TrajectoryPlan]]:
    """Groups of plans from a JSONL trace: rows {"prompt", "index", "turn", "prompt_tokens",
    "gen_tokens", "obs_tokens", "tool_seconds", "shared_prompt_tokens"} (the last three
    optional); turns of one (prompt, index) in turn order."""
    rows: dict[str, dict[int, list[dict]]] = {}
    for _, where, row in jsonl_objects(path, "trace", ValueError):
        missing = {"prompt", "index", "turn", "prompt_tokens", "gen_tokens"} - row.keys()
        if missing:
            raise ValueError(f"{where}: missing {', '.join(sorted(missing))}")
        rows.setdefault(str(row["prompt"]), {}).setdefault(int(row["index"]), []).append(row)
    groups = []
    for by_index in rows.values():
        group = []
        for index in sorted(by_index):
            turns = sorted(by_index[index], key=lambda r: r["turn"])
            plans = tuple(TurnPlan(int(t["gen_tokens"]), int(t.get("obs_tokens", 0)), float(t.get("tool_seconds", 0.0)))
                          for t in turns)
            last = plans[-1]  # a final tool call (the environment ending it) keeps its time
            plans = (*plans[:-1], TurnPlan(last.gen_tokens, 0, last.tool_seconds))
            prompt_tokens = int(turns[0]["prompt_tokens"])
            shared = min(prompt_tokens, int(turns[0].get("shared_prompt_tokens", 0)))
            group.append(TrajectoryPlan(prompt_tokens, plans, shared))
        groups.append(group)
    return groups


def recorded_trace(groups: Iterable[Group]) -> list[dict[str, Any]]:
    """A run's turns as trace rows (`read_trace`'s format), in the groups' admission order:
    each trajectory's current attempt, as far as it got. `shared_prompt_tokens` is the
    prefix every recorded prompt shares (the system prompt and tool schemas of a dataset),
    read from the finished trajectories' records (an unfinished one has only its counts)."""
    trajectories = [(group, t) for group in sorted(groups, key=lambda g: g.seq) for t in group.trajectories if t.turns]
    prompts = [t.token_ids[: t.turns[0].context_tokens] for _, t in trajectories if t.token_ids]
    shared = shared_prefix_length(prompts) if prompts else 0
    rows = []
    for group, t in trajectories:
        for number, turn in enumerate(t.turns):
            following = t.turns[number + 1].context_tokens if number + 1 < len(t.turns) else 0
            rows.append({"prompt": group.prompt.id, "index": t.index, "turn": number,
                         "prompt_tokens": t.turns[0].context_tokens,

                         "shared_prompt_tokens": shared, "gen_tokens": turn.generated_tokens,
                         "obs_tokens": following, "tool_seconds": turn.tool_seconds or 0.0})
    return rows


def write_trace(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Rows as JSONL, the format `read_trace` reads."""
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))


def shared_prefix_length(sequences: list[list[int]]) -> int:
    """How many leading tokens all `sequences` share (a whole sequence, if it is a prefix of
    the rest; the trainer's `common_prefix_length` leaves each one token of its own)."""
    first = sequences[0]
    return min(next((i for i, (x, y) in enumerate(zip(first, other, strict=False)) if x != y),
                    min(len(first), len(other))) for other in sequences)
