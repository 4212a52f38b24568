"""ARCHITECTURE.md stays true: every `path:function` it cites names a function or class
(or `Class.method`) defined in that file, and every path it cites exists."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "ARCHITECTURE.md"
# `src/venusrl/engine/admission.py:admit_waiting` or `...:Class.method`
CITATION = re.compile(r"`((?:src|tests)/[\w/]+\.py):([A-Za-z_][\w.]*)`")


def citations() -> list[tuple[str, str]]:
    return sorted(set(CITATION.findall(DOC.read_text())))


def defined_names(path: Path) -> set[str]:
    """Top-level functions and classes, and `Class.member` for each class's functions."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(f"{node.name}.{m.name}" for m in node.body
                         if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


def test_the_doc_cites_the_mechanisms():
    assert len(citations()) >= 40


@pytest.mark.parametrize(("path", "name"), citations())
def test_cited_function_is_defined_there(path, name):
    source = ROOT / path
    assert source.is_file(), f"ARCHITECTURE.md cites {path}, which does not exist"
    assert name in defined_names(source), f"ARCHITECTURE.md cites {path}:{name}, not defined there"


def test_every_table_row_of_mechanisms_cites_code():
    section = DOC.read_text().split("## 3. Paper mechanisms", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Mechanism")]
    assert rows
    for row in rows:
        where = row.split("|")[2]
        assert CITATION.search(where), f"mechanism row without a path:function: {row[:80]}"
