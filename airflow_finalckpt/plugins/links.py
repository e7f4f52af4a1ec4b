"""The "Pipeline" extra link of every stage task: the pipeline page of the task's DAG run.

The page is the plugin's external view on Airflow's DAG-run page
(``/dags/<dag_id>/runs/<run_id>/plugin/finalckpt-pipeline``), so the link opens it inside the
Airflow UI, next to the run's other tabs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
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
        from airflow.configuration import conf

        return str(conf.get("api", "base_url", fallback="") or "").rstrip("/")
    except Exception:  # a worker without Airflow core: relative links work in the UI
        return ""


def pipeline_page_url(dag_id: str, run_id: str) -> str:
    """The Airflow UI URL of the pipeline page of a DAG run."""
    return (
        f"{airflow_base_url()}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
        f"/plugin/{RUN_VIEW_ROUTE}"
    )


class PipelineLink(BaseOperatorLink):
    """Extra link "Pipeline" on FinalCheckpointStageOperator tasks."""

    name = "Pipeline"

    @property
    def operators(self) -> list[type[Any]]:  # type: ignore[override]
        # Resolved lazily: the plugin module imports this one and must stay cheap, and the
        # operator module imports this one too.
        from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator

        return [FinalCheckpointStageOperator]

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        return pipeline_page_url(ti_key.dag_id, ti_key.run_id)
