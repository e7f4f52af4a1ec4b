"""The Airflow plugin of airflow-finalckpt.

Airflow loads it through the ``airflow.plugins`` entry point in every component (API server,
scheduler, triggerer, DAG processor, workers), so this module must stay cheap and side-effect
free: no database, no Spark, no configuration lookups at import time.

It registers:

* ``fastapi_apps``: the stop/drain/resume/restore REST API and the UI pages, mounted by the
  api-server at ``/finalckpt`` (built on first access, i.e. only in the api-server);
* ``react_apps``: the pipeline page as a tab of every DAG run (``dag_run``) and a top-level
  "Pipelines" page listing all pipeline runs (``nav``), React apps rendered inside Airflow's
  UI from the bundle built from ``ui/`` (``static/ui/finalckpt-ui.js``). A checkout whose
  bundle was not built (no npm run) registers the server-rendered pages as ``external_views``
  (iframes) under the same routes instead, so links to them work either way;
* ``operator_extra_links``: the "Pipeline" link of every stage task.
"""

from __future__ import annotations

from importlib import resources
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


#: the React bundle, relative to Airflow's ``<base href>`` (Airflow may live under a sub-path)
BUNDLE_URL = URL_PREFIX.lstrip("/") + "/static/ui/finalckpt-ui.js"
BUNDLE_FILE = ("api", "static", "ui", "finalckpt-ui.js")


def bundle_built() -> bool:
    """Whether the React bundle is in the package: a stat, no import (``plugins.api`` would
    import FastAPI), so every component can afford it.
    """
    return resources.files("airflow_finalckpt.plugins").joinpath(*BUNDLE_FILE).is_file()


def ui_views(react: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(external_views, react_apps): the two pages as React apps, or as iframes without a
    bundle. Both use the same ``url_route``s, so a link works whichever is registered.
    """
    pages: list[dict[str, Any]] = [
        {"name": "Pipeline", "destination": "dag_run", "url_route": RUN_VIEW_ROUTE},
        {
            "name": "Pipelines",
            "destination": "nav",
            "url_route": NAV_VIEW_ROUTE,
            "nav_top_level": True,
        },
    ]
    if react:
        return [], [{**page, "bundle_url": BUNDLE_URL} for page in pages]
    hrefs = {
        "dag_run": URL_PREFIX + "/ui/dags/{DAG_ID}/runs/{RUN_ID}",
        "nav": URL_PREFIX + "/ui/runs",
    }
    return [{**page, "href": hrefs[str(page["destination"])]} for page in pages], []


_EXTERNAL_VIEWS, _REACT_APPS = ui_views(bundle_built())


class FinalCheckpointPlugin(AirflowPlugin):
    """airflow-finalckpt: Flink-style final checkpoints for multi-stage PySpark pipelines."""

    name = "finalckpt"
    fastapi_apps = _LazyFastAPIApps()
    external_views = _EXTERNAL_VIEWS
    react_apps = _REACT_APPS
    operator_extra_links = [PipelineLink()]  # noqa: RUF012
    #: writes the DAG run note of a drained run (in the scheduler)
    listeners = [dag_run_notes]  # noqa: RUF012
