"""How every benchmark hands back its figures: JSON on stdout, and in a file when asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def emit(result: dict[str, Any], json_out: Path | None) -> None:
    text = json.dumps(result, indent=2)
    if json_out:
        json_out.write_text(text + "\n")
    typer.echo(text)
