"""Which DAG run drives a pipeline, as a pure rule: one DAG run at a time starts stage attempts,
so two runs on one pipeline key never take the epoch from each other in turn.

The pipeline row records its driver. A run that is not the driver may start attempts only if
it joined the pipeline after the driver (a continuation or restore, never an older run coming
back) and either the driver has no live attempt (no RUNNING stage whose lease is running:
``core.plan.attempt_gone``) or its conf says ``"take_over": true``. Else it is refused with a
message naming the driver and how to end it. A run the driver superseded is refused for good.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_finalckpt.core.errors import PipelineDrivenError

#: The DAG run conf key that takes a pipeline over from the run still driving it.
TAKE_OVER_KEY = "take_over"


def drive_request(dag_id: str, run_id: str, conf: Mapping[str, Any]) -> dict[str, Any]:
    """``start_pipeline``'s driving arguments for a DAG run with ``conf``."""
    return {"driver": (dag_id, run_id), "take_over": conf.get(TAKE_OVER_KEY) is True}


@dataclass(frozen=True)
class DagRunRef:
    """A DAG run by its DAG id and run id, with when it joined the pipeline (None: not yet)."""

    dag_id: str
    run_id: str
    joined_at: float | None = None

    def same_run(self, other: DagRunRef | None) -> bool:
        """Whether ``other`` is this DAG run."""
        return other is not None and (other.dag_id, other.run_id) == (self.dag_id, self.run_id)

    def describe(self) -> str:
        """``DAG run RUN of DAG DAG``."""
        return f"DAG run {self.run_id!r} of DAG {self.dag_id!r}"


def check_drive(
    pipeline_key: str,
    driver: DagRunRef | None,
    me: DagRunRef,
    live_stages: Sequence[str],
    *,
    take_over: bool,
) -> bool:
    """True if ``me`` becomes the driver (a new pipeline, or taking it over), False if it is
    the driver already; PipelineDrivenError (permanent: not retried) if refused.
    """
    if driver is None:
        return True
    if me.same_run(driver):
        return False
    end = (
        f"end it first (mark it failed in the Airflow UI or `airflow dags ...`, "
        f"or `finalckpt stop {driver.dag_id} {driver.run_id} --drain`)"
    )
    if me.joined_at is not None and (driver.joined_at is None or me.joined_at < driver.joined_at):
        raise PipelineDrivenError(
            f"pipeline {pipeline_key!r} was taken over by {driver.describe()}: this older run "
            "may not start stage attempts any more (a newer run drives the pipeline)"
        )
    if live_stages and not take_over:
        raise PipelineDrivenError(
            f"pipeline {pipeline_key!r} is driven by {driver.describe()}, whose attempts of "
            f"{', '.join(map(repr, live_stages))} still run: {end}, or start this run with "
            f'conf {{"{TAKE_OVER_KEY}": true}} to take the pipeline over (the old run\'s tasks '
            "then fail without retries)"
        )
    return True
