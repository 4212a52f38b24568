"""`venusrl predictor ...`: train and evaluate length predictors on (messages,
remaining_tokens) JSONL; write a synthetic example file to try them on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

predictor_app = typer.Typer(help="Length predictors of remaining generation tokens.", no_args_is_help=True)

KIND_HELP = "group_history, learned or lm"


def _fail(err: Exception) -> None:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2) from None


def _config(kind: str, path: Path | None, lm_model: Path | None, epochs: int, max_tokens: int, device: str,
            iterations: int = 200):
    from pydantic import ValidationError

    from venusrl.coordinator.config import PredictorConfig

    try:
        return PredictorConfig(
            kind=kind, path=str(path) if path else None, lm_model=str(lm_model) if lm_model else None,
            lm_epochs=epochs, lm_max_tokens=max_tokens, lm_device=device, boosting_iterations=iterations,
        )
    except ValidationError as err:
        _fail(ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())))


@predictor_app.command("train")
def train(
    data: Annotated[Path, typer.Argument(help="JSONL of (messages, remaining_tokens) rows")],
    out: Annotated[Path, typer.Option(help="where to write the predictor (file; directory for lm)")],
    kind: Annotated[str, typer.Option(help=KIND_HELP)] = "learned",
    lm_model: Annotated[Path | None, typer.Option(help="lm: Hugging Face model to fine-tune")] = None,
    iterations: Annotated[int, typer.Option(min=1, help="learned: boosting rounds")] = 200,
    epochs: Annotated[int, typer.Option(min=1, help="lm: epochs")] = 2,
    max_tokens: Annotated[int, typer.Option(min=8, help="lm: tokens kept per example")] = 1024,
    device: Annotated[str, typer.Option(help="lm: torch device")] = "cpu",
) -> None:
    """Fit a predictor on every row and save it."""
    from venusrl.coordinator.dataset import DatasetError
    from venusrl.coordinator.predictors import PredictorError, make_predictor
    from venusrl.coordinator.predictors.examples_io import read_examples

    try:
        examples = read_examples(data)
        predictor = make_predictor(_config(kind, None, lm_model, epochs, max_tokens, device, iterations))
        predictor.fit(examples)
        predictor.save(out)
    except (DatasetError, PredictorError) as err:
        _fail(err)
    typer.echo(f"trained {kind} on {len(examples)} examples: wrote {out}")


@predictor_app.command("eval")
def evaluate(
    data: Annotated[Path, typer.Argument(help="JSONL of (messages, remaining_tokens) rows")],
    path: Annotated[Path, typer.Option(help="trained predictor (file; directory for lm)")],
    kind: Annotated[str, typer.Option(help=KIND_HELP)] = "learned",
    max_tokens: Annotated[int, typer.Option(min=8, help="lm: tokens kept per example")] = 1024,
    device: Annotated[str, typer.Option(help="lm: torch device")] = "cpu",
    json_out: Annotated[Path | None, typer.Option("--json", help="also write the figures here")] = None,
) -> None:
    """Spearman, MAE, MAPE and latency of a trained predictor on the rows."""
    from venusrl.coordinator.dataset import DatasetError
    from venusrl.coordinator.predictors import PredictorError, make_predictor
    from venusrl.coordinator.predictors.evaluate import accuracy, latency
    from venusrl.coordinator.predictors.examples_io import read_examples

    try:
        examples = read_examples(data)
        predictor = make_predictor(_config(kind, path, None, 1, max_tokens, device))
    except (DatasetError, PredictorError) as err:
        _fail(err)
    result = {"predictor": kind, "path": str(path), "data": str(data)}
    result.update(accuracy(predictor.predict_many([e.query for e in examples]), examples))
    result.update(latency(predictor, examples, samples=200))
    text = json.dumps(result, indent=2)
    if json_out:
        json_out.write_text(text + "\n")
    typer.echo(text)


@predictor_app.command("synth")
def synth(
    out: Annotated[Path, typer.Argument(help="JSONL to write")],
    prompts: Annotated[int, typer.Option(min=1, help="prompts")] = 100,
    group_size: Annotated[int, typer.Option(min=1, help="trajectories per prompt")] = 8,
    seed: int = 0,
) -> None:
    """Write (messages, remaining_tokens) rows of the synthetic multi-turn workload."""
    from venusrl.coordinator.predictors.examples_io import write_examples
    from venusrl.coordinator.predictors.synthetic import synthesize

    rows = write_examples(out, (e for t in synthesize(prompts, group_size, seed) for e in t.examples()))
    typer.echo(f"wrote {rows} rows to {out}")
