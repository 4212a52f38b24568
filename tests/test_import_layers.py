"""The import graph of the source tree (every `import`, at module level or inside a function):
the command line is the top layer, and no library package reaches up into it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every venusrl module `path` imports, by full name (`from a import b` counts a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "venusrl" or name.startswith("venusrl.")}


def import_graph() -> dict[str, set[str]]:
    return {module_name(path): imported_modules(path) for path in SRC.rglob("*.py")}


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_graph_sees_the_source_tree():
    graph = import_graph()
    assert "venusrl.cli" in graph and "venusrl.cli.main" in graph
    assert any(within(target, "venusrl.config") for target in graph["venusrl.cli.support"])


def test_no_library_module_imports_the_command_line():
    offenders = sorted(f"{module} imports {target}" for module, targets in import_graph().items()
                       if not within(module, "venusrl.cli") and module != "venusrl.__main__"
                       for target in targets if within(target, "venusrl.cli"))
    assert offenders == []



def test_the_simulator_and_the_benchmarks_do_not_import_each_other():
    """One direction only: the benchmarks fit and drive the simulator's cost model (bench ->
    sim); the simulator imports nothing of the benchmarks; the trace format both read and
    write sits below both (`venusrl.trace`)."""
    graph = import_graph()
    sim_to_bench = sorted(f"{module} imports {target}" for module, targets in graph.items()
                          if within(module, "venusrl.sim") for target in targets if within(target, "venusrl.bench"))
    assert sim_to_bench == []
    trace_users = [module for module, targets in graph.items() if "venusrl.trace" in targets]
    assert any(within(m, "venusrl.bench") for m in trace_users) and any(within(m, "venusrl.sim") for m in trace_users)
    assert not any(within(t, "venusrl.bench") or within(t, "venusrl.sim") for t in graph["venusrl.trace"])
