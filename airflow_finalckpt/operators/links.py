"""Where the plugin's pages live in the Airflow UI: routes, URLs and the link to a run's page.

The pipeline page is the plugin's external view on Airflow's DAG-run page
(``/dags/<dag_id>/runs/<run_id>/plugin/finalckpt-pipeline``), so a link to it opens inside the
Airflow UI, next to the run's other tabs. A leaf module on the operator's side, so imports run
one way: the stage operator carries ``PipelinePageLink``, and the plugin (which imports this
module, never the other way round) registers its subclass ``plugins.links.PipelineLink``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: ``url_route`` of the plugin's external view on the DAG-run page.
RUN_VIEW_ROUTE = "finalckpt-pipeline"
#: ``url_route`` of the plugin's top-level page (all pipeline runs).
NAV_VIEW_ROUTE = "finalckpt"


def airflow_base_url() -> str:
    """``[api] base_url`` without a trailing slash, or "" (links stay relative to the UI)."""
    try:
        from airflow.configuration import conf  # Airflow core: absent on a Task SDK-only worker

        return str(conf.get("api", "base_url", fallback="") or "").rstrip("/")
    except Exception:  # a worker without Airflow core: relative links work in the UI
        return ""


def pipeline_page_url(dag_id: str, run_id: str) -> str:
    """The Airflow UI URL of the pipeline page of a DAG run."""
    return (
        f"{airflow_base_url()}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
        f"/plugin/{RUN_VIEW_ROUTE}"
    )


class PipelinePageLink(BaseOperatorLink):
    """Extra link "Pipeline": the pipeline page of the task's DAG run."""

    name = "Pipeline"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        """The page of the task's DAG run (the same page for every stage of the run)."""
        return pipeline_page_url(ti_key.dag_id, ti_key.run_id)
