"""The dry run's split-list checks: what each stage's task will be told about its declared
split list when a restore or a continuation runs, by the rules the task itself applies
(``core.split_list``). Only a fixed list can be checked before the run; a list the task
computes (a callable of the run, an incremental source, the upstream stages' parts) is named
as checked when the task runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import CheckpointRecord, StageLifecycle, StageStatus
from airflow_finalckpt.core.split_list import DeclaredSplits, dry_run_split_list

#: The operator attributes Airflow serializes for the dry run (``operators/stage.py``).
FIXED_SPLITS_FIELD = "fixed_splits"
ALLOW_CHANGE_FIELD = "allow_split_list_change"


def dag_declared_splits(tasks: Iterable[Any]) -> dict[str, DeclaredSplits]:
    """Each stage task's split list as its DAG declares it (live operators or Airflow's
    serialized ones): the ids of a fixed list, else None.
    """
    declared = {}
    for task in tasks:
        stage_id = getattr(task, "stage_id", None)
        if stage_id is None:
            continue
        fixed = getattr(task, FIXED_SPLITS_FIELD, None)
        declared[str(stage_id)] = DeclaredSplits(
            splits=None if fixed is None else tuple(str(s) for s in fixed),
            allow_change=bool(getattr(task, ALLOW_CHANGE_FIELD, False)),
        )
    return declared


def continuation_split_lists(
    coordinator: Coordinator, declared: Mapping[str, DeclaredSplits], since: str
) -> dict[str, str]:
    """A continuation of the stored progress: one line per stage with progress (raises the
    task's error for a split list it would refuse).
    """
    notes = {}
    for stage_id, view in sorted(coordinator.stages().items()):
        progress = view.progress
        started = view.lifecycle is not StageLifecycle.NOT_STARTED
        if not (started or progress.finished_splits or progress.split_list_sha256):
            continue
        notes[stage_id] = dry_run_split_list(
            stage_id,
            finished_stage=view.lifecycle.is_finished,
            recorded=view.progress.split_list_sha256,
            finished=view.progress.finished_splits,
            declared=declared.get(stage_id),
            since=since,
        )
    return notes


def restore_split_lists(
    record: CheckpointRecord, declared: Mapping[str, DeclaredSplits], since: str
) -> dict[str, str]:
    """A restore of a checkpoint: one line per stage it recorded as started."""
    notes = {}
    for stage_id, stage in sorted(record.stages.items()):
        if stage.status is StageStatus.NOT_STARTED or stage_id not in declared:
            continue
        notes[stage_id] = dry_run_split_list(
            stage_id,
            finished_stage=stage.status is StageStatus.FULLY_FINISHED,
            recorded=stage.split_list_sha256,
            finished=stage.finished_splits,
            declared=declared[stage_id],
            since=since,
        )
    return notes
