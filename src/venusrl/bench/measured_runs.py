"""The validation's measured runs on disk, so the simulator can be checked against them again
without measuring (`venusrl simulate --scenario validate --measured-dir DIR`): one file per
run, `NAME.json.gz`, the rollout bench's JSON of that run with every round's recorded turns
and timeline (`bench.run(record=True)`).

A directory that does not exist or is empty is filled by measuring; one with files is read,
and each run it must hold is checked: a file that is missing, not gzip'd JSON, without a
round's turns or timeline, or measured on another case than the one expected is an error
naming the file.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

SUFFIX = ".json.gz"
RECORDED = ("trace", "timeline")  # what every round must carry to be replayed and fitted on


class MeasuredRunsError(ValueError):
    """A measured dir that cannot be read as the runs it must hold."""


def path_of(directory: Path, name: str) -> Path:
    return directory / f"{name}{SUFFIX}"


def is_empty(directory: Path) -> bool:
    """True where nothing was recorded yet: no such directory, or an empty one."""
    if directory.exists() and not directory.is_dir():
        raise MeasuredRunsError(f"measured dir {directory}: not a directory")
    return not directory.exists() or not any(directory.iterdir())


def save(directory: Path, name: str, run: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    path_of(directory, name).write_bytes(gzip.compress(json.dumps(run).encode(), mtime=0))


def load(directory: Path, name: str, case: dict[str, Any], modes: tuple[str, ...]) -> dict[str, Any]:
    """Run `name`, checked: measured on `case` (the bench's case fields), each of `modes`
    with rounds that carry their recorded turns and timeline."""
    path = path_of(directory, name)
    if not path.exists():
        raise MeasuredRunsError(f"{path}: missing (the measured dir holds no run {name!r}; measure into an empty dir)")
    try:
        run = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MeasuredRunsError(f"{path}: not gzip'd JSON ({err})") from None
    if not isinstance(run, dict) or not isinstance(run.get("case"), dict):
        raise MeasuredRunsError(f"{path}: no bench case")
    differs = sorted(k for k in case.keys() | run["case"].keys() if case.get(k) != run["case"].get(k))
    if differs:
        raise MeasuredRunsError(f"{path}: measured on another case than {name!r} is (fields {', '.join(differs)})")
    for mode in modes:
        rounds = run.get(mode, {}).get("rounds") if isinstance(run.get(mode), dict) else None
        if not rounds:
            raise MeasuredRunsError(f"{path}: no rounds of {mode}")
        for number, measured_round in enumerate(rounds):
            missing = [k for k in RECORDED if not measured_round.get(k)]
            if missing:
                raise MeasuredRunsError(f"{path}: {mode} round {number} has no {' or '.join(missing)}")
    return run
