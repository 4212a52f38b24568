"""Sandbox backends: how a node agent runs sandboxes. `process` is the default."""
