"""Permanent errors fail the Airflow task without retries; transient ones keep them.

The classification is :func:`airflow_finalckpt.core.errors.is_permanent`; this module only turns
a permanent error into Airflow's ``AirflowFailException`` (the task fails on this try, whatever
its ``retries``). Retrying a garbage ``restore_from`` three times only delays the one-line error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_finalckpt.core.errors import (
    FinalCheckpointError,
    PipelineDrivenError,
    StaleEpochError,
    is_permanent,
)

F = TypeVar("F", bound=Callable[..., Any])


def taken_over(task: Any, context: Any, exc: Exception, key: str | None) -> Exception:
    """A stale attempt (or a wait that ended stale) of a DAG run that no longer drives its
    pipeline (another run took it over, ``core.driving``): a PipelineDrivenError, which is not
    retried (a retry would only be refused); else ``exc``.
    """
    if not isinstance(exc, (StaleEpochError, FinalCheckpointError)) or is_permanent(exc):
        return exc
    key = key or getattr(task, "_pipeline_key", None)
    run_id = context.get("run_id") if isinstance(context, dict) or hasattr(context, "get") else None
    if not key or not run_id:
        return exc
    try:
        driver = task._hook().get_coordinator(key).driver()
    except Exception:  # the store is unreachable: keep the original error (and its retries)
        return exc
    if driver is None or driver == (task.dag_id, run_id):
        return exc
    return PipelineDrivenError(
        f"stage {task.stage_id!r}: DAG run {driver[1]!r} of DAG {driver[0]!r} took pipeline "
        f"{key!r} over; this run's attempt stops for good ({exc})"
    )


def fail_permanent_errors(method: F) -> F:
    """Decorate an operator method: permanent errors (and the stale attempts of a DAG run
    another run took over) become ``AirflowFailException`` with the same message (the original
    error is chained); everything else propagates unchanged.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as caught:
            exc = caught
            if len(args) >= 2:
                exc = taken_over(args[0], args[1], caught, kwargs.get("pipeline_key"))
            if not is_permanent(exc):
                raise
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(
                f"{type(exc).__name__}: {exc} (permanent: not retried)"
            ) from caught

    return wrapper  # type: ignore[return-value]
