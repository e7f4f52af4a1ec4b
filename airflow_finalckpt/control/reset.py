"""Recompute a committed stage on purpose: ``finalckpt reset`` (CLI, REST, UI button).

A reset forgets the progress of a stage and of every stage downstream of it (they read its
output, so they follow), in one transition; their committed output stays committed. The next
try of each task then runs it from scratch: clear the tasks in Airflow (the answer names
them). Its sinks replace the run's slice where they declare one, and append otherwise: the
way to accept an append where the clear-recomputes rule (``core.rerun``) refuses one.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from airflow_finalckpt.control.service import PipelineControl
from airflow_finalckpt.core.errors import StopRequestError, UnknownStageError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.views import savepoint_in_progress


class ResetSummary(BaseModel):
    """What a reset did and what to do next."""

    model_config = ConfigDict(frozen=True)

    dag_id: str
    run_id: str
    pipeline_key: str
    stage_id: str
    reset_stages: list[str]
    task_ids: list[str]
    requested_by: str | None = None
    next_step: str


def downstream_closure(graph: StageGraph, stage_id: str) -> list[str]:
    """The stage and every stage downstream of it, in topological order."""
    found = {stage_id}
    for sid in graph.topological_order():
        if any(up in found for up in graph.upstream(sid)):
            found.add(sid)
    return [sid for sid in graph.topological_order() if sid in found]


def reset_stage(
    control: PipelineControl,
    dag_id: str,
    run_id: str,
    stage_id: str,
    requested_by: str | None = None,
) -> ResetSummary:
    """Reset ``stage_id`` and its downstream stages of the DAG run's pipeline. Refused with
    UnknownStageError for a stage the pipeline does not have, and StopRequestError while a
    stop with savepoint is in progress (it is waiting for those stages).
    """
    key = control.resolve(dag_id, run_id)
    coordinator = control.coordinator(key)
    graph = coordinator.graph()
    if stage_id not in graph:
        raise UnknownStageError(
            f"pipeline {key!r} has no stage {stage_id!r}; its stages: "
            f"{', '.join(graph.topological_order())}"
        )
    stop = coordinator.stop_request()
    if savepoint_in_progress(stop):
        raise StopRequestError(
            f"pipeline {key!r} is stopping with a savepoint; reset {stage_id!r} after the stop "
            "completed or failed"
        )
    stages = downstream_closure(graph, stage_id)
    coordinator.reset_stages(stages)
    task_ids = [graph.stages[sid].airflow_task_id for sid in stages]
    pattern = "|".join(task_ids)
    return ResetSummary(
        dag_id=dag_id,
        run_id=run_id,
        pipeline_key=key,
        stage_id=stage_id,
        reset_stages=stages,
        task_ids=task_ids,
        requested_by=requested_by,
        next_step=(
            f"clear tasks {', '.join(task_ids)} of DAG run {run_id} (Airflow UI 'Clear', or "
            f"airflow tasks clear {dag_id} -t '^({pattern})$' -y with the run's logical date): "
            "they recompute from scratch; sinks with a declared slice replace it, the others "
            "append"
        ),
    )
