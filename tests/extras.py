"""The optional extras a test module needs: skipped where an extra is not installed (a laptop
with a partial install), failed where it must be (CI).

``FINALCKPT_REQUIRE_EXTRAS=1`` (set by ``.ci/run``) turns a missing extra's skip into a failure,
as ``FINALCKPT_REQUIRE_POSTGRES=1`` does for an unreachable PostgreSQL (tests/conftest.py): a
broken install would otherwise skip whole modules and the suite would still pass.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_EXTRAS = "FINALCKPT_REQUIRE_EXTRAS"


def extras_required() -> bool:
    return os.environ.get(REQUIRE_EXTRAS) == "1"


def import_extra(module: str, extra: str) -> ModuleType:
    """``module`` from the ``extra`` of pyproject.toml: skips the calling test or module when it
    is missing, fails it instead when ``FINALCKPT_REQUIRE_EXTRAS=1``."""
    reason = f"needs the [{extra}] extra (scripts/setup.sh installs it): no {module}"
    if not extras_required():
        return pytest.importorskip(module, reason=reason)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{reason}, but {REQUIRE_EXTRAS}=1: {exc}", pytrace=False)
