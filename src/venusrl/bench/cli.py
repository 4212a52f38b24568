"""`venusrl bench ...`: one command per benchmark module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

bench_app = typer.Typer(help="Benchmarks; each writes its figures as JSON.", no_args_is_help=True)


@bench_app.command("engine")
def bench_engine(
    quick: Annotated[bool, typer.Option("--quick", help="smaller workload, minutes not tens of minutes")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
) -> None:
    """Engine vs transformers tokens/s and greedy agreement; KV hit rate of an agentic
    workload under a tight KV budget for lru, tiers and tiers_demotion."""
    from venusrl.bench.engine import main

    main(quick, json_out)

from venusrl.bench.predictor import predictor_command  # noqa: E402
from venusrl.bench.scheduler import scheduler_command  # noqa: E402

bench_app.command("predictor")(predictor_command)
bench_app.command("scheduler")(scheduler_command)
