"""Fixtures of the Helm chart tests (helpers in chart_helpers.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from chart_helpers import CHART_DIR, Rendered, helm, render_chart


@pytest.fixture(scope="session")
def chart() -> Iterator[Any]:
    """The chart, loaded once (helm-python-sdk handle)."""
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture
def render(chart: Any) -> Callable[..., Rendered]:
    """``render(values, release=..., namespace=...) -> Rendered``."""

    def _render(values: dict[str, Any] | None = None, **kwargs: Any) -> Rendered:
        return render_chart(chart, values, **kwargs)

    return _render
