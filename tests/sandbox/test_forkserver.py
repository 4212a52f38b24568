"""forkserver.py runs as the image's own Python, where venusrl is not installed: it must
stay one stdlib-only file that Python 3.8 can parse."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from venusrl.sandbox import forkserver

SOURCE = Path(forkserver.__file__).read_text()


def test_it_parses_as_python_3_8():
    ast.parse(SOURCE, feature_version=(3, 8))


def test_it_imports_the_standard_library_alone():
    tree = ast.parse(SOURCE)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_it_uses_nothing_newer_than_python_3_8_from_the_library():
    """What 3.9+ added that this file would be tempted to use; it carries its own."""
    newer = {"removeprefix", "removesuffix", "recv_fds", "send_fds", "waitstatus_to_exitcode", "setns", "pidfd_open"}
    tree = ast.parse(SOURCE)
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and (isinstance(node.value, ast.Name) and node.value.id in ("os", "socket") or "fix" in node.attr)} & newer
    strict = [node for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg == "strict"]
    assert not used and not strict, used


def test_setup_errors_name_the_template():
    with pytest.raises(forkserver.SetupError, match="template t: cannot import no_such_module"):
        forkserver.run_python_setup("t", ["no_such_module"], "", {})
    namespace: dict = {}
    forkserver.run_python_setup("t", ["json", "email.parser"], "X = json.dumps(1)", namespace)
    assert namespace["X"] == "1" and namespace["email"].parser
