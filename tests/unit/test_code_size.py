"""The size limits of the architecture (issue 15), checked on every run rather than by eye: no
module of the package over 600 lines, no class over 500. A newcomer reads a module in one
sitting; a class that grows past the limit has a seam to split along."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_finalckpt"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 500


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def oversized(source: str, name: str) -> list[str]:
    """What in ``source`` breaks a limit, as readable lines (empty: nothing)."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{name}: {lines} lines (limit {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > MAX_CLASS_LINES:
                found.append(f"{name}: class {node.name} {size} lines (limit {MAX_CLASS_LINES})")
    return found


def test_the_package_is_found() -> None:
    assert len(_modules()) > 100


def test_no_module_or_class_over_the_limits() -> None:
    found = [
        problem
        for path in _modules()
        for problem in oversized(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1\n" * (MAX_MODULE_LINES + 1), "601 lines"),
        ("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES, "class Big 501 lines"),
    ],
)
def test_a_planted_oversized_module_or_class_is_reported(source: str, expected: str) -> None:
    (problem,) = oversized(source, "planted.py")
    assert expected in problem
