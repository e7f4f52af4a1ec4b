"""The Airflow plugin of airflow-finalckpt.

Airflow loads it through the ``airflow.plugins`` entry point in every component (API server,
scheduler, triggerer, DAG processor, workers), so this module must stay cheap and side-effect
free: no database, no Spark, no configuration lookups at import time.

It registers:

* ``fastapi_apps``: the stop/drain/resume/restore REST API and the UI pages, mounted by the
  api-server at ``/finalckpt`` (built on first access, i.e. only in the api-server);
* ``external_views``: the pipeline page as a tab of every DAG run (``dag_run``) and a
  top-level "Pipelines" page listing all pipeline runs (``nav``);
* ``operator_extra_links``: the "Pipeline" link of every stage task.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_finalckpt.listeners import dag_run_notes
from airflow_finalckpt.plugins.links import NAV_VIEW_ROUTE, RUN_VIEW_ROUTE, PipelineLink

URL_PREFIX = "/finalckpt"


class _LazyFastAPIApps:
    """``fastapi_apps`` built when first read: FastAPI and the control service are imported
    by the api-server only, never by schedulers, triggerers or workers.
    """

    def __get__(self, obj: object, owner: type | None = None) -> list[dict[str, Any]]:
        from airflow_finalckpt.plugins.api import get_app

        return [{"app": get_app(), "url_prefix": URL_PREFIX, "name": "airflow-finalckpt"}]


class FinalCheckpointPlugin(AirflowPlugin):
    """airflow-finalckpt: Flink-style final checkpoints for multi-stage PySpark pipelines."""

    name = "finalckpt"
    fastapi_apps = _LazyFastAPIApps()
    external_views = [  # noqa: RUF012 - Airflow's plugin interface: plain class attributes
        {
            "name": "Pipeline",
            "href": URL_PREFIX + "/ui/dags/{DAG_ID}/runs/{RUN_ID}",
            "destination": "dag_run",
            "url_route": RUN_VIEW_ROUTE,
        },
        {
            "name": "Pipelines",
            "href": URL_PREFIX + "/ui/runs",
            "destination": "nav",
            "url_route": NAV_VIEW_ROUTE,
            "nav_top_level": True,
        },
    ]
    operator_extra_links = [PipelineLink()]  # noqa: RUF012
    #: writes the DAG run note of a drained run (in the scheduler)
    listeners = [dag_run_notes]  # noqa: RUF012
