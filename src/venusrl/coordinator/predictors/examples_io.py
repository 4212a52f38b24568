"""JSONL of (messages, remaining_tokens) rows: what `venusrl predictor train|eval` read."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from venusrl.coordinator.dataset import DatasetError, jsonl_objects, parse_messages
from venusrl.coordinator.predictors.query import Example, query_from_messages

MATE_FIELDS = ("total", "done", "done_mean_tokens", "mean_generated")


class ExampleError(DatasetError):
    """A malformed predictor example row, naming the file, line and field."""


def read_examples(path: str | Path) -> list[Example]:
    """Rows: {"messages": [...], "remaining_tokens": int} and optionally "generated_tokens",
    "tool_errors" (ints >= 0), "prompt_id" (string) and "mates" ({total, done,
    done_mean_tokens, mean_generated}). Every row is validated before any is returned."""
    return [example_from_row(row, where) for _, where, row in jsonl_objects(path, "examples", ExampleError)]


def example_from_row(row: dict[str, Any], where: str) -> Example:
    for name in ("messages", "remaining_tokens"):
        if name not in row:
            raise ExampleError(f"{where}: missing field '{name}'")
    try:
        messages = parse_messages(row["messages"], where)
    except DatasetError as err:
        raise ExampleError(str(err)) from None
    remaining = _count(row, "remaining_tokens", where)
    generated = _count(row, "generated_tokens", where) if "generated_tokens" in row else None
    tool_errors = _count(row, "tool_errors", where) if "tool_errors" in row else None
    prompt_id = row.get("prompt_id")
    if prompt_id is not None and not isinstance(prompt_id, str):
        raise ExampleError(f"{where}: field 'prompt_id' must be a string")
    mates = row.get("mates")
    if mates is not None:
        if not isinstance(mates, dict):
            raise ExampleError(f"{where}: field 'mates' must be an object")
        for key, value in mates.items():
            if key not in MATE_FIELDS:
                raise ExampleError(f"{where}: mates.{key}: unknown (known: {', '.join(MATE_FIELDS)})")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ExampleError(f"{where}: mates.{key} must be a number >= 0")
    query = query_from_messages(
        messages, generated_tokens=generated, tool_errors=tool_errors, prompt_id=prompt_id, mates=mates
    )
    return Example(query, remaining)


def _count(row: dict[str, Any], name: str, where: str) -> int:
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExampleError(f"{where}: field '{name}' must be an integer >= 0, got {value!r}")
    return value


def example_row(example: Example) -> dict[str, Any]:
    q = example.query
    return {
        "messages": list(q.messages),
        "remaining_tokens": example.remaining_tokens,
        "generated_tokens": q.generated_tokens,
        "tool_errors": q.tool_errors,
        "prompt_id": q.prompt_id,
        "mates": {
            "total": q.mates_total,
            "done": q.mates_done,
            "done_mean_tokens": q.mates_done_mean_tokens,
            "mean_generated": q.mates_mean_generated,
        },
    }


def write_examples(path: str | Path, examples: Iterable[Example]) -> int:
    count = 0
    with Path(path).open("w") as f:
        for example in examples:
            f.write(json.dumps(example_row(example), ensure_ascii=False) + "\n")
            count += 1
    return count
