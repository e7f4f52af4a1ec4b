"""tests/extras.py: a missing extra skips its tests, unless FINALCKPT_REQUIRE_EXTRAS=1 (CI)."""

from __future__ import annotations

import pytest

from tests.extras import REQUIRE_EXTRAS, import_extra

MISSING = "finalckpt_no_such_extra_module"


def test_a_missing_extra_skips_without_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_EXTRAS, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"needs the \[lakehouse\] extra"):
        import_extra(MISSING, "lakehouse")


def test_a_missing_extra_fails_with_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_EXTRAS, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_EXTRAS}=1: No module named"):
        import_extra(MISSING, "lakehouse")


@pytest.mark.parametrize("required", ["0", "1"])
def test_an_installed_extra_is_imported(monkeypatch: pytest.MonkeyPatch, required: str) -> None:
    monkeypatch.setenv(REQUIRE_EXTRAS, required)
    assert import_extra("json", "dev").__name__ == "json"


def test_ci_requires_the_extras() -> None:
    from pathlib import Path

    ci = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    assert f"export {REQUIRE_EXTRAS}=1\n" in ci
