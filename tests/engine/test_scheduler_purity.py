"""The engine scheduler is pure (DESIGN.md §3): neither it nor any venusrl module it imports,
transitively, imports torch, threads, sockets, asyncio or a clock."""

import ast
import subprocess
import sys
from pathlib import Path

import venusrl

SRC = Path(venusrl.__file__).parent
FORBIDDEN = {"torch", "threading", "asyncio", "socket", "time", "concurrent", "multiprocessing", "numpy"}
# and the CUDA-graph bucket choice, decision code of the runner kept pure the same way
SCHEDULER_MODULES = ["scheduler", "admission", "kv_book", "request_queue", "demotion", "scheduler_stats", "graph_buckets"]


def imported_modules(module: str) -> set[str]:
    tree = ast.parse((SRC / Path(*module.split(".")[1:])).with_suffix(".py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def venusrl_closure(roots: list[str]) -> dict[str, set[str]]:
    """Module -> its imports, for every venusrl module reachable from ``roots``."""
    seen: dict[str, set[str]] = {}
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen[module] = imported_modules(module)
        for name in seen[module]:
            if name.startswith("venusrl.") and (SRC / Path(*name.split(".")[1:])).with_suffix(".py").is_file():
                todo.append(name)
    return seen


def test_scheduler_modules_import_nothing_impure():
    closure = venusrl_closure([f"venusrl.engine.{name}" for name in SCHEDULER_MODULES])
    assert {f"venusrl.engine.{name}" for name in SCHEDULER_MODULES} <= closure.keys()
    offenders = {
        module: sorted(name for name in names if name.split(".")[0] in FORBIDDEN)
        for module, names in closure.items()
    }
    assert {m: names for m, names in offenders.items() if names} == {}
    assert "venusrl.engine.runner" not in closure and "venusrl.engine.engine" not in closure


def test_importing_the_scheduler_loads_no_torch():
    code = "import sys, venusrl.engine.scheduler; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
