"""Permanent errors fail the Airflow task without retries; transient ones keep them.

The classification is :func:`airflow_finalckpt.core.errors.is_permanent`; this module only turns
a permanent error into Airflow's ``AirflowFailException`` (the task fails on this try, whatever
its ``retries``). Retrying a garbage ``restore_from`` three times only delays the one-line error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_finalckpt.core.errors import is_permanent

F = TypeVar("F", bound=Callable[..., Any])


def fail_permanent_errors(method: F) -> F:
    """Decorate an operator method: permanent errors become ``AirflowFailException`` with the
    same message (the original error is chained); everything else propagates unchanged.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            if not is_permanent(exc):
                raise
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(
                f"{type(exc).__name__}: {exc} (permanent: not retried)"
            ) from exc

    return wrapper  # type: ignore[return-value]
