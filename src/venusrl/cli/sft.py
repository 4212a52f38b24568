"""`venusrl sft`: supervised warm start on demonstrations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def sft(
    model: Annotated[Path, typer.Option(help="Hugging Face model directory to start from")],
    out: Annotated[Path, typer.Option(help="directory to write the fine-tuned model into")],
    env: Annotated[str, typer.Option(help="environment whose generated demonstrations to train on")] = "calculator",
    data: Annotated[Path | None, typer.Option(
        help='JSONL of {"messages": [...], "tools": [...]} to train on instead of --env')] = None,
    examples: Annotated[int, typer.Option(help="demonstrations to generate (with --env)")] = 256,
    epochs: int = 2,
    lr: float = 1e-5,
    batch_size: int = 8,
    seed: int = 0,
    chat_template_kwargs: Annotated[str | None, typer.Option(
        help='JSON object of chat template arguments, e.g. \'{"enable_thinking": false}\'')] = None,
    tool_call_format: Annotated[str, typer.Option(help="auto, hermes, qwen3_coder or llama3_json")] = "auto",
    progress: bool = True,
) -> None:
    """Fine-tune a model on demonstrations; the loss covers the assistant's tokens only."""
    from venusrl.logs import setup_logging
    from venusrl.model.chat import load_tokenizer
    from venusrl.trainer.sft import SFTDataError, read_conversations_jsonl, sft_examples, train_sft

    setup_logging("INFO")
    try:
        if data is not None:
            rows = read_conversations_jsonl(data)
            conversations, tools, where = rows.conversations, rows.tools, [f"{data}:{n}" for n in rows.lines]
        else:
            conversations, tools = _demonstrations(env, examples, seed)
            where = [f"{env} demonstration {i}" for i in range(len(conversations))]
        try:
            tokenizer = load_tokenizer(model, _json_object(chat_template_kwargs), tool_call_format)
            train_examples = sft_examples(tokenizer, conversations, tools)
        except SFTDataError as err:
            raise ValueError(f"{where[err.index]}: {err.reason}") from None
        metrics = train_sft(model, out, train_examples, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                            progress=progress)
    except (ValueError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps({"out": str(out), **metrics}, indent=2))


def _json_object(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--chat-template-kwargs: not valid JSON ({err.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--chat-template-kwargs: expected a JSON object, got {type(value).__name__}")
    return value


def _demonstrations(env: str, count: int, seed: int) -> tuple[list[list[dict]], list[dict]]:
    if env != "calculator":
        raise ValueError(f"no generated demonstrations for environment {env!r} (calculator has them); "
                         "pass --data FILE")
    if count < 1:
        raise ValueError(f"--examples must be at least 1, got {count}")
    from venusrl.env.calculator import CALCULATE_TOOL, demonstration, generate_dataset

    return [demonstration(row) for row in generate_dataset(count, seed)], [CALCULATE_TOOL]
