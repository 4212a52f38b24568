"""Start a training run in its run directory: the resolved config and the log go there, then
the configured runtime (local or Ray) trains. `venusrl train` and the demo both start here."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from venusrl.config import Config
from venusrl.durable import write_atomic


def resolve_run_dir(config: Config, run_dir: Path | None) -> Path:
    if run_dir is not None:
        return run_dir
    if config.run.run_dir is not None:
        return Path(config.run.run_dir)
    return Path("runs") / f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_training(config: Config, run_dir: Path, progress: bool = True) -> dict:
    """Write the resolved config and the log into `run_dir`, then train on the configured runtime."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "config.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    with _logging_to(run_dir / "train.log", config.run.log_level):
        if config.run.runtime == "ray":
            from venusrl.runtime.ray_runtime import train as train_on_ray

            return train_on_ray(config, run_dir, progress)
        from venusrl.runtime.local import train as train_locally

        return train_locally(config, run_dir, progress)


@contextlib.contextmanager
def _logging_to(path: Path, level: str) -> Iterator[None]:
    """Every event at `level` to the run's log file; only warnings on the console, under the
    bar. The previous handlers come back afterwards."""
    root = logging.getLogger()
    previous, previous_level = list(root.handlers), root.level
    for handler in previous:
        root.removeHandler(handler)
    file_handler = logging.FileHandler(path)
    file_handler.setLevel(level)
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in (file_handler, console):
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level)
    try:
        yield
    finally:
        for handler in (file_handler, console):
            root.removeHandler(handler)
            handler.close()
        for handler in previous:
            root.addHandler(handler)
        root.setLevel(previous_level)
