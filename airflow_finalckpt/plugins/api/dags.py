"""The pipeline graph of a DAG as Airflow last parsed it, read in the api-server.

Only the api-server reads Airflow's serialized DAGs (it is Airflow's own process, with Airflow's
metadata database): the REST restore checks a graph change with it, and
``GET /finalckpt/api/dags/{dag_id}/stages`` hands it to the ``finalckpt`` CLI, which talks to
Airflow through its REST API only. Airflow's own ``GET /api/v2/dags/{dag_id}/tasks`` does not
answer the operators' ``stage_id``, which the graph needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import HTTPException, status

from airflow_finalckpt.control import dag_declared_splits, dag_stage_graph
from airflow_finalckpt.core.errors import UnknownDagError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.split_list import DeclaredSplits

T = TypeVar("T")


class AirflowUnavailableError(RuntimeError):
    """No usable Airflow metadata database in this process (not configured, not migrated)."""


def _serialized_tasks(dag_id: str) -> Any:
    """The tasks of the latest serialized version of ``dag_id``.

    UnknownDagError if Airflow does not know the DAG; AirflowUnavailableError if its metadata
    database cannot be read.
    """
    try:
        from airflow.models.serialized_dag import SerializedDagModel

        dag = SerializedDagModel.get_dag(dag_id)
    except Exception as exc:  # no database, not migrated...
        raise AirflowUnavailableError(f"{type(exc).__name__}: {exc}") from exc
    if dag is None:
        raise UnknownDagError(f"DAG {dag_id!r} is not known to Airflow (not parsed yet, or a typo)")
    return dag.tasks


def load_dag_graph(dag_id: str) -> StageGraph:
    """The stage graph of the latest serialized version of ``dag_id`` (errors: as
    :func:`_serialized_tasks`).
    """
    return dag_stage_graph(_serialized_tasks(dag_id))


def dag_graph(dag_id: str) -> StageGraph:
    """:func:`load_dag_graph` for a route: 404 for an unknown DAG, 503 without a database."""
    return _for_route(dag_id, load_dag_graph)


def dag_splits(dag_id: str) -> dict[str, DeclaredSplits]:
    """Each stage's declared split list (a fixed list, else None) for a route, as
    :func:`dag_graph`: what the dry run checks the split-list rules with.
    """
    return _for_route(dag_id, lambda d: dag_declared_splits(_serialized_tasks(d)))


def _for_route(dag_id: str, load: Callable[[str], T]) -> T:
    try:
        return load(dag_id)
    except AirflowUnavailableError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, f"cannot read DAG {dag_id!r}: {exc}"
        ) from exc
    except UnknownDagError as exc:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"DAG {dag_id!r} not found: Airflow has not parsed it (yet), or a typo",
        ) from exc


def dag_run_state(dag_id: str, run_id: str) -> tuple[bool, str | None]:
    """(Airflow knows the DAG, the DAG run's state or None if it has no such run): what a 404
    of the pipeline page says. (False, None) when Airflow's database cannot be read.
    """
    try:
        from airflow.models.dag import DagModel
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            known = session.scalar(select(DagModel.dag_id).where(DagModel.dag_id == dag_id))
            state = session.scalar(
                select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
            )
    except Exception:  # no database, not migrated: say only what the store says
        return False, None
    return known is not None or state is not None, None if state is None else str(state)


#: DAG run states in which a stage may still register the pipeline (the page waits for it)
WAITING_RUN_STATES = frozenset({"queued", "running"})


def pipeline_not_found(dag_id: str, run_id: str) -> HTTPException:
    """The 404 of a DAG run without a pipeline run, saying which of the three it is: no such
    DAG, no such DAG run, or a DAG run none of whose stages started (yet). The header
    ``X-Finalckpt-Reason`` (``dag`` / ``run`` / ``not_started``) tells the page whether to wait.
    """
    known, state = dag_run_state(dag_id, run_id)
    if not known:
        reason, detail = "dag", f"DAG {dag_id!r} not found"
    elif state is None:
        reason, detail = "run", f"DAG run {run_id!r} of DAG {dag_id!r} not found"
    elif state in WAITING_RUN_STATES:
        reason = "not_started"
        detail = f"DAG run {run_id!r} is {state}: none of its pipeline stages has started yet"
    else:
        reason = "no_pipeline"
        detail = f"DAG run {run_id!r} is {state} and ran no pipeline stage"
    return HTTPException(
        status.HTTP_404_NOT_FOUND,
        detail,
        headers={"X-Finalckpt-Reason": reason, "X-Finalckpt-Dag-Run-State": state or ""},
    )
