"""The "Pipeline" extra link of every stage task, as the plugin registers it.

The link opens the pipeline page of the task's DAG run (``plugins.pages``). The stage operator
carries the same link (``PipelinePageLink``); the plugin's registration also names the operator
class, so the API server shows the link from the serialized DAG while the task runs.
"""

from __future__ import annotations

from typing import Any

from airflow_finalckpt.plugins.pages import (
    NAV_VIEW_ROUTE,
    RUN_VIEW_ROUTE,
    PipelinePageLink,
    airflow_base_url,
    pipeline_page_url,
)

__all__ = [
    "NAV_VIEW_ROUTE",
    "RUN_VIEW_ROUTE",
    "PipelineLink",
    "airflow_base_url",
    "pipeline_page_url",
]


class PipelineLink(PipelinePageLink):
    """Extra link "Pipeline" on FinalCheckpointStageOperator tasks."""

    @property
    def operators(self) -> list[type[Any]]:  # type: ignore[override]
        # Imported when Airflow asks, not with this module: every Airflow component imports the
        # plugin, which must stay cheap (no operator, store or Spark modules at import).
        from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator

        return [FinalCheckpointStageOperator]
