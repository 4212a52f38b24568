"""The `venusrl` command line: one module per command group. Library packages never import
this layer (tests/test_import_layers.py checks it); it imports them."""

from venusrl.cli.main import app, main

__all__ = ["app", "main"]
