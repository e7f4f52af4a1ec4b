"""docs/reference.md is generated from the signatures and docstrings (scripts/gen_reference.py):
it must be current, and an argument without a ``:param:`` line must fail the generator."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", ROOT / "scripts" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_page_is_current() -> None:
    gen = _generator()
    assert gen.PAGE.read_text() == gen.render(), (
        "docs/reference.md is stale: run .venv/bin/python scripts/gen_reference.py and commit"
    )


def test_every_public_argument_is_on_the_page() -> None:
    gen = _generator()
    page = gen.PAGE.read_text()
    for path, kind in gen.SUBJECTS:
        if kind == "decorator":
            continue
        for parameter in gen.arguments(gen.load(path)):
            assert f"| `{parameter.name}` |" in page, (path, parameter.name)


def test_an_undocumented_argument_fails_the_generator() -> None:
    gen = _generator()

    class Planted:
        """A class with one documented argument.

        :param documented: it is.
        """

        template_fields = ("documented",)

        def __init__(self, documented: int = 1, forgotten: str | None = None) -> None:
            pass

    with pytest.raises(gen.UndocumentedArgumentError, match=r"\['forgotten'\]"):
        gen.argument_table(Planted)
    Planted.__doc__ = (Planted.__doc__ or "") + "\n:param forgotten: now documented.\n"
    table = gen.argument_table(Planted)
    assert "| `documented` | `int` | `1` | yes | it is. |" in table
    assert "| `forgotten` | `str \\| None` | `None` | no | now documented. |" in table
