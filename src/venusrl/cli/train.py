"""`venusrl train`."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
import yaml

from venusrl.cli_support import load_config_or_exit
from venusrl.config import Config
from venusrl.durable import write_atomic


def train(
    config_path: Annotated[Path, typer.Argument(metavar="CONFIG.yaml", help="run configuration")],
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted key=value overrides")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="default: run.run_dir, else runs/NAME-TIMESTAMP; "
                                                       "a directory with a checkpoint is resumed")] = None,
    progress: Annotated[bool, typer.Option(help="show the progress bar")] = True,
) -> None:
    """Train a policy with RL through multi-turn tool use; resumes from RUN_DIR's newest checkpoint."""
    config = load_config_or_exit(config_path, overrides)
    directory = resolve_run_dir(config, run_dir)
    try:
        summary = run_training(config, directory, progress)
    except ValueError as err:  # bad data, model or checkpoint, named by the message
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"run directory {directory}: {summary['steps']} steps in {summary['wall_s']:.0f}s, held-out accuracy "
               f"{_fmt(summary['accuracy_before'])} -> {_fmt(summary['accuracy_after'])}")


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


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
