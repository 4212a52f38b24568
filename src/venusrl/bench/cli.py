"""`venusrl bench ...`: one command per benchmark module."""

from __future__ import annotations

import typer

bench_app = typer.Typer(help="Benchmarks; each writes its figures as JSON.", no_args_is_help=True)
