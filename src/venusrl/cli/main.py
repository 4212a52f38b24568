"""The `venusrl` command: the root app, `config show` and `demo`; every other command group is
one module of this package, added here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from venusrl.cli.bench import bench_app
from venusrl.cli.model import model_app
from venusrl.cli.predictor import predictor_app
from venusrl.cli.report import report
from venusrl.cli.sandbox import bench as sandbox_bench
from venusrl.cli.sandbox import sandbox_app
from venusrl.cli.serve import serve
from venusrl.cli.sft import sft
from venusrl.cli.simulate import simulate
from venusrl.cli.support import load_config_or_exit
from venusrl.cli.train import train

app = typer.Typer(help="venusrl: agentic RL training through multi-turn tool use.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(bench_app, name="bench")
app.add_typer(sandbox_app, name="sandbox")
bench_app.command("sandbox")(sandbox_bench)
app.add_typer(predictor_app, name="predictor")
app.command("serve")(serve)
app.command("train")(train)
app.command("report")(report)
app.command("sft")(sft)
app.command("simulate")(simulate)

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
    config_path: Annotated[Path, typer.Argument(metavar="CONFIG.yaml", help="demo configuration")] = Path("examples/demo.yaml"),
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted key=value overrides, e.g. scheduler.policy=action_level")] = None,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
) -> None:
    """Build a tiny model, warm-start it with SFT, train it with GRPO on the calculator task,
    and report held-out accuracy before and after."""
    from venusrl.demo import run_demo

    if not config_path.exists():
        typer.echo(f"error: {config_path}: no such demo configuration (run from the repository root)", err=True)
        raise typer.Exit(2)
    run_demo(load_config_or_exit(config_path, overrides), progress=progress)


def main() -> None:
    app()
