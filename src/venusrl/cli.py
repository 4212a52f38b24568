"""The `venusrl` command. Sub-commands live beside the code they drive and are added here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from venusrl.bench.cli import bench_app
from venusrl.cli_support import load_config_or_exit
from venusrl.coordinator.cli import predictor_app
from venusrl.engine.cli import serve
from venusrl.logs import setup_logging
from venusrl.model.cli import model_app
from venusrl.sandbox.cli import bench as sandbox_bench
from venusrl.sandbox.cli import sandbox_app

app = typer.Typer(help="venusrl: agentic RL training through multi-turn tool use.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(bench_app, name="bench")
app.add_typer(sandbox_app, name="sandbox")
bench_app.command("sandbox")(sandbox_bench)
app.add_typer(predictor_app, name="predictor")
app.command("serve")(serve)

config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(
    path: Annotated[Path | None, typer.Argument(help="YAML config; defaults when omitted")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted key=value overrides")] = None,
) -> None:
    """Print the fully resolved config (defaults, file, overrides) as YAML."""
    config = load_config_or_exit(path, overrides)
    typer.echo(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


@app.command()
def demo(
    workdir: Annotated[Path, typer.Option(help="where the tiny model and demo.json go")] = Path("runs/demo"),
    groups: int = 2,
    group_size: int = 4,
    seed: int = 0,
) -> None:
    """Build the tiny model and run groups of calculator rollouts on the engine."""
    from venusrl.demo import run_demo

    setup_logging("WARNING")
    run_demo(workdir, groups=groups, group_size=group_size, seed=seed)


def main() -> None:
    app()
