"""`venusrl train`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from venusrl.cli.support import load_config_or_exit
from venusrl.runtime.interrupted import RunInterrupted
from venusrl.runtime.launch import resolve_run_dir, run_training


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
    except RunInterrupted as err:  # a node lost that the run cannot do without
        typer.echo(f"interrupted: {err}", err=True)
        raise typer.Exit(3) from None
    if summary.get("resumed_from"):
        typer.echo(f"resumed from checkpoint {summary['resumed_from']}")
    typer.echo(f"run directory {directory}: {summary['steps']} steps in {summary['wall_s']:.0f}s, held-out accuracy "
               f"{_fmt(summary['accuracy_before'])} -> {_fmt(summary['accuracy_after'])}")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
