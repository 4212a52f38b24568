"""Environment resource manager: sandboxes on node agents behind a cluster controller.

Public API: `LocalCluster` (start node agents + controller), `SandboxController`,
`Sandbox` / `AsyncSandbox` (E2B-shaped), `Template`, `SandboxConfig`, and the errors.
Imports are lazy so the zygote and node agent processes load only what they use.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Sandbox": "venusrl.sandbox.api",
    "AsyncSandbox": "venusrl.sandbox.api",
    "CommandResult": "venusrl.sandbox.api",
    "LocalCluster": "venusrl.sandbox.cluster",
    "SandboxController": "venusrl.sandbox.controller",
    "Template": "venusrl.sandbox.template",
    "SandboxConfig": "venusrl.sandbox.config",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(module), name)
