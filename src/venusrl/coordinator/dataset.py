"""Prompt datasets: JSONL rows of chat messages (or a plain prompt string) with metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from venusrl.types import Prompt


class DatasetError(ValueError):
    """A malformed dataset row, naming the file, line and field."""


def read_prompts(path: str | Path) -> list[Prompt]:
    """Every row of a JSONL file as a Prompt, validated before any is used.

    A row is an object with `messages` (a list of {"role", "content"} objects) or `prompt`
    (a string, taken as one user message); `id` is optional (default: the line number) and
    every other key goes to Prompt.metadata for the environment.
    """
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for number, where, row in jsonl_objects(path, "dataset", DatasetError):
        prompt = prompt_from_row(row, where, default_id=str(number))
        if prompt.id in seen:
            raise DatasetError(f"{where}: id {prompt.id!r} repeats line {seen[prompt.id]}")
        seen[prompt.id] = number
        prompts.append(prompt)
    return prompts


def jsonl_objects(path: str | Path, what: str, error: type[ValueError]) -> list[tuple[int, str, dict[str, Any]]]:
    """(line number, "FILE:LINE", object) for every non-blank line; `error` names the first
    line that is not a JSON object, or the file when it cannot be read or has no rows."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise error(f"{path}: cannot read {what} ({err.strerror})") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{where}: invalid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict):
            raise error(f"{where}: row must be a JSON object, got {type(row).__name__}")
        rows.append((number, where, row))
    if not rows:
        raise error(f"{path}: no rows")
    return rows


def prompt_from_row(row: dict[str, Any], where: str, default_id: str) -> Prompt:
    if "messages" in row:
        messages = parse_messages(row.pop("messages"), where)
    elif "prompt" in row:
        text = row["prompt"]  # kept in the metadata too: environments may read it
        if not isinstance(text, str):
            raise DatasetError(f"{where}: field 'prompt' must be a string, got {type(text).__name__}")
        messages = ({"role": "user", "content": text},)
    else:
        raise DatasetError(f"{where}: row needs a 'messages' or a 'prompt' field")
    row_id = row.pop("id", default_id)
    if not isinstance(row_id, (str, int)) or isinstance(row_id, bool):
        raise DatasetError(f"{where}: field 'id' must be a string or integer, got {row_id!r}")
    return Prompt(id=str(row_id), messages=messages, metadata=row)


def parse_messages(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}: field 'messages' must be a non-empty list")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise DatasetError(f"{where}: messages[{i}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise DatasetError(f"{where}: messages[{i}].role must be a non-empty string")
        content = message.get("content", "")
        if content is not None and not isinstance(content, str):
            raise DatasetError(f"{where}: messages[{i}].content must be a string")
    return tuple(value)
