"""`venusrl serve`: the engine behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

log = logging.getLogger(__name__)


def serve(
    model: Annotated[Path, typer.Option(help="Hugging Face model directory")],
    config: Annotated[Path | None, typer.Option(help="YAML config (its engine and model sections apply)")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted key=value overrides, e.g. engine.page_size=32")] = None,
    host: Annotated[str, typer.Option(help="bind address; loopback unless told otherwise")] = "127.0.0.1",
    port: int = 8000,
    api_key: Annotated[str | None, typer.Option(help="require 'Authorization: Bearer KEY'")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="model id reported by /v1/models")] = None,
) -> None:
    """Serve MODEL over /v1/chat/completions and /v1/completions."""
    import uvicorn

    from venusrl.cli.support import load_config_or_exit
    from venusrl.engine.async_engine import AsyncEngine
    from venusrl.engine.engine import Engine
    from venusrl.engine.server import create_app
    from venusrl.logs import setup_logging

    settings = load_config_or_exit(config, overrides)
    setup_logging(settings.run.log_level)
    engine = Engine.from_pretrained(model, settings.engine, settings.model.dtype, settings.model.device)
    engine.tokenizer.configure(settings.model.chat_template_kwargs, settings.model.tool_call_format)
    log.info("serving %s on http://%s:%d (KV pool %d tokens)", model, host, port, settings.engine.kv_capacity_tokens)
    app = create_app(AsyncEngine(engine), engine.tokenizer, served_model_name or model.name, api_key)
    uvicorn.run(app, host=host, port=port, log_level="warning")
