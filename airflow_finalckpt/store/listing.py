"""The pipelines list's index: what the list filters, sorts and counts on, for every pipeline
of the store in four statements (however many pipelines there are), so that only the rows of
the page shown need a full summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine, func, select

from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.core.views import StopRequest
from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store import schema as t


@dataclass
class PipelineIndexRow:
    """One pipeline as the list sees it before summarizing it."""

    pipeline_key: str
    #: (dag_id, run_id) of its DAG runs, in the order they were linked
    dag_runs: list[tuple[str, str]] = field(default_factory=list)
    #: when the newest DAG run was linked (the list's "newest first")
    linked_at: float = 0.0
    started_at: float | None = None
    #: the newest change of any of its stages
    last_stage_change: float | None = None
    lifecycles: list[StageLifecycle] = field(default_factory=list)
    stop: StopRequest | None = None


def pipeline_index(engine: Engine, dag_id: str | None = None) -> list[PipelineIndexRow]:
    """Every pipeline with a DAG run (of ``dag_id`` if given), unordered."""
    index: dict[str, PipelineIndexRow] = {}
    with engine.connect() as conn:
        links = select(t.dag_runs).order_by(t.dag_runs.c.created_at, t.dag_runs.c.run_id)
        if dag_id is not None:
            keys_of_dag = select(t.dag_runs.c.pipeline_key).where(t.dag_runs.c.dag_id == dag_id)
            links = links.where(t.dag_runs.c.pipeline_key.in_(keys_of_dag))
        for link in conn.execute(links).mappings():
            row = index.setdefault(link["pipeline_key"], PipelineIndexRow(link["pipeline_key"]))
            row.dag_runs.append((str(link["dag_id"]), str(link["run_id"])))
            row.linked_at = max(row.linked_at, float(link["created_at"]))
        if not index:
            return []
        for key, created in conn.execute(
            select(t.pipelines.c.pipeline_key, t.pipelines.c.created_at)
        ):
            if key in index:
                index[key].started_at = float(created)
        stages = select(t.stages.c.pipeline_key, t.stages.c.lifecycle, t.stages.c.updated_at)
        for key, lifecycle, updated in conn.execute(stages):
            if key in index:
                row = index[key]
                row.lifecycles.append(StageLifecycle(lifecycle))
                row.last_stage_change = max(row.last_stage_change or 0.0, float(updated))
        newest = select(func.max(t.stop_requests.c.request_id)).group_by(
            t.stop_requests.c.pipeline_key
        )
        stops = select(t.stop_requests).where(t.stop_requests.c.request_id.in_(newest))
        for stop in conn.execute(stops).mappings():
            if stop["pipeline_key"] in index:
                index[stop["pipeline_key"]].stop = r.stop_request(stop)
    return list(index.values())


def pipeline_times(engine: Engine, pipeline_key: str) -> tuple[float | None, float | None]:
    """(when the pipeline was registered, the newest change of any of its stages)."""
    with engine.connect() as conn:
        started = conn.execute(
            select(t.pipelines.c.created_at).where(t.pipelines.c.pipeline_key == pipeline_key)
        ).scalar()
        changed = conn.execute(
            select(func.max(t.stages.c.updated_at)).where(t.stages.c.pipeline_key == pipeline_key)
        ).scalar()
    return (
        None if started is None else float(started),
        None if changed is None else float(changed),
    )


def checkpoint_count(engine: Engine, pipeline_key: str) -> int:
    """How many checkpoints and savepoints the pipeline's history holds."""
    with engine.connect() as conn:
        count = conn.execute(
            select(func.count())
            .select_from(t.checkpoints)
            .where(t.checkpoints.c.pipeline_key == pipeline_key)
        ).scalar()
    return int(count or 0)
