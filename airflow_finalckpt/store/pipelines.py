"""The coordination store across pipelines: list them with what retention needs, and delete
one pipeline's rows (every table, one transaction holding its lock).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Engine, Table, case, func, select

from airflow_finalckpt.core.model import CheckpointKind, StageLifecycle
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.cursors import release_ranges
from airflow_finalckpt.store.writes import lock_pipeline

#: Every table holding a pipeline's rows, children first.
_PIPELINE_TABLES: tuple[Table, ...] = (
    t.sink_dates,
    t.acks_due,
    t.acks,
    t.checkpoints,
    t.transactions,
    t.stop_requests,
    t.dag_runs,
    t.stages,
    t.pipelines,
)


@dataclass(frozen=True)
class PipelineRow:
    """One pipeline as ``finalckpt pipelines list`` shows it."""

    pipeline_key: str
    created_at: float
    last_change: float
    stages_total: int
    stages_closed: int
    checkpoints: int
    savepoints: int
    dag_runs: tuple[tuple[str, str], ...]
    #: the pipeline of the re-created DAG run that replaced this one (None: not superseded)
    superseded_by: str | None = None

    @property
    def closed(self) -> bool:
        """Every stage CLOSED (a pipeline without stages is not)."""
        return self.stages_total > 0 and self.stages_closed == self.stages_total


_SAVEPOINT_KINDS = (CheckpointKind.SAVEPOINT.value, CheckpointKind.DRAINED_SAVEPOINT.value)


def pipeline_rows(engine: Engine, keys: Iterable[str] | None = None) -> list[PipelineRow]:
    """Every pipeline (or those of ``keys``), oldest first, with stage and checkpoint counts."""
    stage_counts = (
        select(
            t.stages.c.pipeline_key,
            func.count().label("total"),
            func.sum(case((t.stages.c.lifecycle == StageLifecycle.CLOSED.value, 1), else_=0)).label(
                "closed"
            ),
            func.max(t.stages.c.updated_at).label("changed"),
        )
        .group_by(t.stages.c.pipeline_key)
        .subquery()
    )
    checkpoint_counts = (
        select(
            t.checkpoints.c.pipeline_key,
            func.count().label("total"),
            func.sum(case((t.checkpoints.c.kind.in_(_SAVEPOINT_KINDS), 1), else_=0)).label(
                "savepoints"
            ),
        )
        .group_by(t.checkpoints.c.pipeline_key)
        .subquery()
    )
    query = (
        select(
            t.pipelines.c.pipeline_key,
            t.pipelines.c.created_at,
            t.pipelines.c.updated_at,
            stage_counts.c.total,
            stage_counts.c.closed,
            stage_counts.c.changed,
            checkpoint_counts.c.total.label("checkpoints"),
            checkpoint_counts.c.savepoints,
            t.pipelines.c.superseded_by,
        )
        .outerjoin(stage_counts, stage_counts.c.pipeline_key == t.pipelines.c.pipeline_key)
        .outerjoin(
            checkpoint_counts, checkpoint_counts.c.pipeline_key == t.pipelines.c.pipeline_key
        )
        .order_by(t.pipelines.c.created_at, t.pipelines.c.pipeline_key)
    )
    if keys is not None:
        query = query.where(t.pipelines.c.pipeline_key.in_(list(keys)))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
        links = conn.execute(
            select(t.dag_runs.c.pipeline_key, t.dag_runs.c.dag_id, t.dag_runs.c.run_id).order_by(
                t.dag_runs.c.created_at
            )
        ).all()
    runs: dict[str, list[tuple[str, str]]] = {}
    for key, dag_id, run_id in links:
        runs.setdefault(str(key), []).append((str(dag_id), str(run_id)))
    return [
        PipelineRow(
            pipeline_key=str(row.pipeline_key),
            created_at=float(row.created_at),
            last_change=max(float(row.updated_at), float(row.changed or 0.0)),
            stages_total=int(row.total or 0),
            stages_closed=int(row.closed or 0),
            checkpoints=int(row.checkpoints or 0),
            savepoints=int(row.savepoints or 0),
            dag_runs=tuple(runs.get(str(row.pipeline_key), ())),
            superseded_by=None if row.superseded_by is None else str(row.superseded_by),
        )
        for row in rows
    ]


def savepoint_ids(engine: Engine, pipeline_key: str) -> set[int]:
    """Ids of the pipeline's savepoints (any state): their directories survive retention."""
    with engine.connect() as conn:
        ids = conn.execute(
            select(t.checkpoints.c.checkpoint_id).where(
                t.checkpoints.c.pipeline_key == pipeline_key,
                t.checkpoints.c.kind.in_(_SAVEPOINT_KINDS),
            )
        ).scalars()
        return {int(i) for i in ids}


def delete_pipeline_rows(engine: Engine, pipeline_key: str) -> int:
    """Delete every row of one pipeline in one transaction holding its lock; the number of
    rows deleted (0: it was not there).
    """
    deleted = 0
    with engine.begin() as conn:
        if lock_pipeline(conn, pipeline_key) is None:
            return release_ranges(conn, pipeline_key)
        for table in _PIPELINE_TABLES:
            result = conn.execute(table.delete().where(table.c.pipeline_key == pipeline_key))
            deleted += int(result.rowcount or 0)
        deleted += release_ranges(conn, pipeline_key)  # its uncommitted source range
    return deleted


def count_pipeline_rows(engine: Engine, pipeline_key: str) -> int:
    """How many rows of every table belong to one pipeline (what a delete would remove)."""
    with engine.connect() as conn:
        return sum(
            int(
                conn.execute(
                    select(func.count())
                    .select_from(table)
                    .where(table.c.pipeline_key == pipeline_key)
                ).scalar_one()
            )
            for table in _PIPELINE_TABLES
        )
