"""`venusrl model ...`: build the tiny model, generate from any model directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

model_app = typer.Typer(help="Model utilities.", no_args_is_help=True)


@model_app.command("make-tiny")
def make_tiny(
    path: Annotated[Path, typer.Argument(help="directory to write the Hugging Face model into")],
    arch: Annotated[str, typer.Option(help="qwen3, qwen2 or llama")] = "qwen3",
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: Annotated[int | None, typer.Option(help="default: hidden / heads")] = None,
    intermediate: Annotated[int | None, typer.Option(help="default: 3 x hidden")] = None,
    tied: Annotated[bool, typer.Option(help="tie lm_head to the embeddings")] = True,
    seed: int = 0,
    tokenizer_dir: Annotated[Path | None, typer.Option(
        help="a real checkpoint's tokenizer (tokenizer.json, tokenizer_config.json with its chat template) "
             "to use instead of the byte-level one")] = None,
) -> None:
    """Write a complete tiny Hugging Face model directory with random weights."""
    from venusrl.model.tiny import make_tiny_model

    try:
        out = make_tiny_model(
            path, arch=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
            head_dim=head_dim, intermediate=intermediate, tie_word_embeddings=tied, seed=seed,
            tokenizer_dir=tokenizer_dir,
        )
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {out}")


@model_app.command("generate")
def generate_cmd(
    model: Annotated[Path, typer.Option(help="Hugging Face model directory")],
    prompt: Annotated[str, typer.Option(help="user message")],
    tools: Annotated[Path | None, typer.Option(help="JSON file with OpenAI-style tool schemas")] = None,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int | None = None,
) -> None:
    """Render a one-message chat, generate a reply and parse its tool calls."""
    from venusrl.model.chat import load_tokenizer
    from venusrl.model.checkpoint import load_model
    from venusrl.model.generate import generate
    from venusrl.types import SamplingParams

    tool_schemas = json.loads(tools.read_text()) if tools else None
    tokenizer = load_tokenizer(model)
    policy = load_model(model)
    prompt_ids = tokenizer.encode_chat([{"role": "user", "content": prompt}], tool_schemas)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    out = generate(policy, prompt_ids, params)
    text = tokenizer.decode(out.token_ids, skip_special_tokens=False)
    body = out.token_ids[:-1] if out.token_ids and out.token_ids[-1] in tokenizer.eos_token_ids else out.token_ids
    parsed = tokenizer.parse_turn(tokenizer.decode(body), tool_schemas)
    typer.echo(json.dumps({
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(out.token_ids),
        "finish_reason": out.finish_reason,
        "text": text,
        "reasoning_content": parsed.reasoning_content,
        "content": parsed.content,
        "tool_calls": parsed.tool_calls,
        "tool_call_errors": [e.message for e in parsed.errors],
    }, indent=2, ensure_ascii=False))
