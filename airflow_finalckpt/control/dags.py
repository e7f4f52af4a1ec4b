"""The pipeline graph of a DAG as Airflow last parsed it, for the checks that run outside a
stage task (``finalckpt restore --dry-run``, the REST and UI restore): the api-server and the
CLI do not parse DAG files, they read Airflow's serialized DAG.
"""

from __future__ import annotations

from airflow_finalckpt.control.service import dag_stage_graph
from airflow_finalckpt.core.errors import UnknownDagError
from airflow_finalckpt.core.graph import StageGraph


class AirflowUnavailableError(RuntimeError):
    """No Airflow installation or metadata database here."""


def load_dag_graph(dag_id: str) -> StageGraph:
    """The stage graph of ``dag_id`` from Airflow's serialized DAG.

    UnknownDagError if Airflow does not know the DAG; AirflowUnavailableError if there is no
    usable Airflow (not installed, no metadata database).
    """
    try:
        from airflow.models.serialized_dag import SerializedDagModel

        dag = SerializedDagModel.get_dag(dag_id)
    except Exception as exc:  # not installed, no database, not migrated...
        raise AirflowUnavailableError(f"{type(exc).__name__}: {exc}") from exc
    if dag is None:
        raise UnknownDagError(f"DAG {dag_id!r} is not known to Airflow (not parsed yet, or a typo)")
    return dag_stage_graph(dag.tasks)
