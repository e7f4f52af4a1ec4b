"""The pipeline-level rules of ``core.definition`` over a DAG's stage tasks: checked when the
DAG file is parsed (the first stage task's ``resolve_template_files``, which Airflow's DagBag
calls once the DAG is whole) and again when a stage task starts (a DAG built another way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_finalckpt.core.definition import (
    SinkDecl,
    StageDecl,
    definition_errors,
    duplicate_stage_ids,
)
from airflow_finalckpt.core.errors import InvalidGraphError, StageDefinitionError


def stage_declarations(tasks: Mapping[str, Any]) -> list[StageDecl]:
    """The stage tasks (by task id) as plain declarations, upstream edges as stage ids."""
    return [
        StageDecl(
            task_id=task.task_id,
            stage_id=task.stage_id,
            upstream=tuple(sorted(tasks[u].stage_id for u in task.upstream_task_ids if u in tasks)),
            primary_input=task.primary_input,
            own_splits=task.splits is not None,
            sinks=tuple(SinkDecl(s.sink_id, s.target()) for s in task.sinks),
        )
        for task in tasks.values()
    ]


def check_pipeline_definition(tasks: Mapping[str, Any]) -> None:
    """Raise the first mistake of the pipeline's definition, in one line: InvalidGraphError for
    a stage id two tasks carry, StageDefinitionError for inputs and sinks.
    """
    stages = stage_declarations(tasks)
    duplicates = duplicate_stage_ids(stages)
    if duplicates:
        raise InvalidGraphError(duplicates[0])
    errors = definition_errors(stages)
    if errors:
        raise StageDefinitionError(errors[0])
