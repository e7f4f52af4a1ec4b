"""Clear or retry: what a new try of a stage task does with a stage that is already CLOSED.

Airflow gives a task a new try number for a retry, a clear of a failed or killed task, and a
clear of a succeeded task (UI, REST, ``airflow tasks clear``, a backfill reprocess), and task
code may not read Airflow's metadata DB to tell them apart. The stage tells them apart itself:
when its task returns successfully it records the try that *published* it (DAG run, task,
try number). Airflow never retries a succeeded task, so:

- a stage not CLOSED (running, finished, suspended, never started) is **run**: it resumes from
  its durable progress (a retry, a clear of a failed or killed try);
- a CLOSED stage published by an earlier try of the same task in the same DAG run was cleared
  after it succeeded: it is **recomputed** (its earlier commit is replaced where its sinks
  declare a slice; otherwise the stage refuses, see :func:`recompute_refusal`);
- a CLOSED stage published by nobody (its closing try crashed before it returned) or by the
  same try (a re-entry of that try) is **re-published**: it closed, its success is only being
  reported again;
- a CLOSED stage published by another DAG run (a ``pipeline_key`` continuation, a restore) is
  **re-published** too: that run owns the commit.

A reset (``finalckpt reset``, and every recompute) forgets the record with the progress, so a
recompute that crashes after closing is re-published by the next try, never recomputed twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airflow_finalckpt.core.model import StageLifecycle


@dataclass(frozen=True)
class TaskTry:
    """One try of one Airflow task in one DAG run (``ti.try_number`` from the Task SDK)."""

    dag_id: str
    run_id: str
    task_id: str
    try_number: int

    def to_dict(self) -> dict[str, Any]:
        """As stored in ``finalckpt_stages.published_by``."""
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "try_number": self.try_number,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> TaskTry | None:
        """The stored record, None if there is none or it is malformed (treated as none)."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(
                dag_id=str(data["dag_id"]),
                run_id=str(data["run_id"]),
                task_id=str(data["task_id"]),
                try_number=int(data["try_number"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        """``try 2 of task agg in DAG run manual__1`` for log lines and errors."""
        return f"try {self.try_number} of task {self.task_id} in DAG run {self.run_id}"


class Publication(StrEnum):
    """What recording a try's return of a CLOSED stage found: one Asset event per commit, so
    of the tries (in any DAG runs) returning one close, only the FIRST announces it.
    """

    FIRST = "first"
    AGAIN = "again"
    NOT_CLOSED = "not-closed"


class AttemptKind(StrEnum):
    """What a new try of a stage task does."""

    RUN = "run"
    REPUBLISH = "republish"
    RECOMPUTE = "recompute"


def attempt_kind(
    lifecycle: StageLifecycle, published_by: TaskTry | None, this: TaskTry
) -> AttemptKind:
    """The rule of the module docstring: RECOMPUTE only for a CLOSED stage whose success an
    earlier try of this very task in this very DAG run already returned.
    """
    if lifecycle is not StageLifecycle.CLOSED:
        return AttemptKind.RUN
    if published_by is None:
        return AttemptKind.REPUBLISH
    same_task = (published_by.dag_id, published_by.run_id, published_by.task_id) == (
        this.dag_id,
        this.run_id,
        this.task_id,
    )
    if same_task and published_by.try_number < this.try_number:
        return AttemptKind.RECOMPUTE
    return AttemptKind.REPUBLISH


def recompute_refusal(
    stage_id: str, published_by: TaskTry, unsliced_sinks: Sequence[str], dag_id: str
) -> str | None:
    """Why a cleared, committed stage cannot be recomputed, None if it can: a sink that
    declares no slice would get the stage's rows a second time (an append). The message names
    both ways out.
    """
    if not unsliced_sinks:
        return None
    return (
        f"stage {stage_id!r} was cleared after it succeeded ({published_by.describe()} "
        f"published it): recomputing it would append its rows a second time to sinks "
        f"{sorted(unsliced_sinks)}, which declare no slice. Either declare the slice a run "
        "owns on those sinks (replace_slice=..., then the recompute replaces it), or accept "
        f"an append: `finalckpt reset {dag_id} {published_by.run_id} --stage {stage_id}` and "
        "clear the task again (rule: clear-recomputes)"
    )
