"""Where the trainer's records go: `run_dir/metrics.jsonl` always, TensorBoard and W&B when configured.

metrics.jsonl holds one JSON object per line. Every record has `kind` (str) and `time_s`
(seconds since run start); "step" and "eval" records also have an int `step`, the x axis
of their scalars in TensorBoard and W&B.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from venusrl.metrics.sinks import TensorBoardSink, WandbSink, scalar_fields

METRICS_FILE = "metrics.jsonl"
SCALAR_KINDS = ("step", "eval")

log = logging.getLogger(__name__)


class MetricsFileError(ValueError):
    """A metrics.jsonl that cannot be read, naming the file and line."""


class MetricsWriter:
    """Appends records to RUN_DIR/metrics.jsonl; "step" and "eval" scalars also go to the
    configured sinks (TensorBoard events under RUN_DIR/tensorboard, W&B)."""

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        run_name: str | None = None,
        config: dict | None = None,
    ) -> None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / METRICS_FILE
        self._sinks: list[TensorBoardSink | WandbSink] = []
        try:
            if tensorboard:
                self._sinks.append(TensorBoardSink(run_dir / "tensorboard"))
            if wandb_project:
                self._sinks.append(WandbSink(wandb_project, run_name, config, run_dir))
        except BaseException:
            self._close_sinks()
            raise
        _end_with_complete_line(self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        _check_record(record)
        line = json.dumps(record, default=_plain_value)
        # One write and a flush per record: a killed run leaves at most one torn last line.
        self._file.write(line + "\n")
        self._file.flush()
        if record["kind"] in SCALAR_KINDS and self._sinks:
            scalars = scalar_fields(record)
            for sink in self._sinks:
                sink.log(record["kind"], record["step"], scalars)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._close_sinks()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_sinks(self) -> None:
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            sink.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl. A torn last line (no newline: the run was killed
    mid-write) is skipped; any other unreadable line is a `MetricsFileError` naming it."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    records = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            records.append(_parse_line(line, path, number))
    if torn.strip():
        try:
            records.append(_parse_line(torn, path, len(lines) + 1))
        except MetricsFileError as err:
            log.warning("skipping torn last line: %s", err)
    return records


def _parse_line(line: bytes, path: Path, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError as err:
        raise MetricsFileError(f"{path}:{number}: corrupt metrics record: {err}") from None
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
        raise MetricsFileError(f"{path}:{number}: not a metrics record (a JSON object with a 'kind')")
    return record


def _check_record(record: dict[str, Any]) -> None:
    if not isinstance(record.get("kind"), str):
        raise ValueError(f"metrics record needs a str 'kind': {record!r}")
    if not isinstance(record.get("time_s"), (int, float)):
        raise ValueError(f"metrics record needs a numeric 'time_s': {record!r}")
    step = record.get("step")
    if record["kind"] in SCALAR_KINDS and (not isinstance(step, int) or isinstance(step, bool)):
        raise ValueError(f"{record['kind']!r} record needs an int 'step': {record!r}")


def _plain_value(value: Any) -> Any:
    """numpy and torch scalars and arrays as plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _end_with_complete_line(path: Path) -> None:
    """Make a resumed run append after a complete line: a torn last line left by a killed
    run would otherwise be glued to the first new record and corrupt the middle of the file."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        end = f.seek(0, os.SEEK_END)
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        start = end
        while start > 0:
            start = max(0, start - 65536)
            f.seek(start)
            cut = f.read(end - start).rfind(b"\n")
            if cut >= 0:
                start += cut + 1
                break
        f.seek(start)
        tail = f.read()
        try:
            _parse_line(tail, path, 0)
            complete = True
        except MetricsFileError:
            complete = False
        if complete:
            f.write(b"\n")
        else:
            f.truncate(start)
            log.warning("%s: dropped a torn last line of %d bytes before appending", path, end - start)
