"""The "Pipeline" extra link of every stage task, as the plugin registers it.

The link opens the pipeline page of the task's DAG run (``operators.links``). The stage operator
carries the same link (``PipelinePageLink``); the plugin's registration also names the operator
class, so the API server shows the link from the serialized DAG while the task runs. Imports run
one way, plugins -> operators: the operator side never imports the plugin.
"""

from __future__ import annotations

from typing import Any

from airflow_finalckpt.operators.links import (
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
        """The operator classes the link is attached to (matched by Airflow on deserialization)."""
        # Imported when Airflow asks, not with this module: every Airflow component imports the
        # plugin, which must stay cheap (no operator, store or Spark modules at import).
        from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator

        return [FinalCheckpointStageOperator]
