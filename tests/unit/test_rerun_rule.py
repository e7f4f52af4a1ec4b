"""The clear-or-retry rule (core.rerun) on plain values: only a CLOSED stage published by an
earlier try of the same task in the same DAG run is recomputed; everything else resumes or
re-publishes as before.
"""

from __future__ import annotations

import pytest

from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.core.rerun import AttemptKind, TaskTry, attempt_kind, recompute_refusal

PUBLISHED = TaskTry("daily", "scheduled__2013-01-01", "aggregate", 1)


def _try(number: int, *, run_id: str = PUBLISHED.run_id, task_id: str = "aggregate") -> TaskTry:
    return TaskTry("daily", run_id, task_id, number)


@pytest.mark.parametrize(
    "lifecycle",
    [
        StageLifecycle.NOT_STARTED,
        StageLifecycle.RUNNING,
        StageLifecycle.SUSPENDED,
        StageLifecycle.FINISHED,
    ],
)
def test_a_stage_that_is_not_closed_resumes_whatever_published_it(
    lifecycle: StageLifecycle,
) -> None:
    # a retry, or a clear of a failed or killed try: the durable progress goes on
    assert attempt_kind(lifecycle, PUBLISHED, _try(2)) is AttemptKind.RUN
    assert attempt_kind(lifecycle, None, _try(2)) is AttemptKind.RUN


def test_a_later_try_of_the_publishing_task_in_its_dag_run_recomputes() -> None:
    # Airflow never retries a succeeded task: this try exists because it was cleared
    assert attempt_kind(StageLifecycle.CLOSED, PUBLISHED, _try(2)) is AttemptKind.RECOMPUTE
    assert attempt_kind(StageLifecycle.CLOSED, PUBLISHED, _try(7)) is AttemptKind.RECOMPUTE


def test_closed_but_never_published_is_republished() -> None:
    # the closing try crashed before it returned: its success is only reported again
    assert attempt_kind(StageLifecycle.CLOSED, None, _try(2)) is AttemptKind.REPUBLISH


def test_the_same_try_again_is_a_republication() -> None:
    assert attempt_kind(StageLifecycle.CLOSED, PUBLISHED, _try(1)) is AttemptKind.REPUBLISH


@pytest.mark.parametrize(
    "other",
    [
        _try(3, run_id="scheduled__2013-01-02"),  # a pipeline_key continuation
        _try(3, task_id="aggregate_v2"),  # another task carries the stage id now
        TaskTry("other_dag", PUBLISHED.run_id, "aggregate", 3),
    ],
)
def test_a_stage_published_by_another_dag_run_or_task_is_republished(other: TaskTry) -> None:
    assert attempt_kind(StageLifecycle.CLOSED, PUBLISHED, other) is AttemptKind.REPUBLISH


def test_task_try_round_trips_and_malformed_records_count_as_none() -> None:
    assert TaskTry.from_dict(PUBLISHED.to_dict()) == PUBLISHED
    assert TaskTry.from_dict(None) is None
    assert TaskTry.from_dict({"dag_id": "d"}) is None
    assert TaskTry.from_dict({**PUBLISHED.to_dict(), "try_number": "x"}) is None


def test_refusal_names_the_sinks_and_both_ways_out() -> None:
    assert recompute_refusal("aggregate", PUBLISHED, [], "daily") is None
    message = recompute_refusal("aggregate", PUBLISHED, ["out_sql", "out_parquet"], "daily")
    assert message is not None
    assert "['out_parquet', 'out_sql']" in message
    assert "replace_slice" in message
    assert "finalckpt reset daily scheduled__2013-01-01 --stage aggregate" in message
    assert "clear-recomputes" in message
