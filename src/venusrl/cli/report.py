"""`venusrl report RUN_DIR`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from venusrl.metrics.writer import METRICS_FILE, MetricsFileError


def report(
    run_dir: Annotated[Path, typer.Argument(help="run directory holding metrics.jsonl")],
    out: Annotated[Path | None, typer.Option(help="where the PNGs and report.md go (default: RUN_DIR/report)")] = None,
) -> None:
    """Draw a run's plots and write report.md from its metrics.jsonl."""
    if not (run_dir / METRICS_FILE).is_file():
        typer.echo(f"no {METRICS_FILE} in {run_dir}: pass the directory of a `venusrl train` run", err=True)
        raise typer.Exit(2)
    from venusrl.metrics.report import write_report

    try:
        path = write_report(run_dir, out)
    except MetricsFileError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    typer.echo(str(path))
