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

