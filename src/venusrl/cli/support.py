"""What every `venusrl` command that reads a config shares."""

from __future__ import annotations

from pathlib import Path

import typer

from venusrl.config import Config, ConfigError, load_config


def load_config_or_exit(path: Path | None, overrides: list[str] | None) -> Config:
    """The resolved config, or exit status 2 with the error (key path, file:line) on stderr."""
    try:
        return load_config(path, overrides or [])
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
