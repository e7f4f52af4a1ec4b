"""The "Pipeline" extra link of stage tasks."""

from __future__ import annotations

import pytest

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.plugins.links import PipelineLink, pipeline_page_url

pytestmark = pytest.mark.usefixtures("airflow_home")


def test_link_points_to_the_pipeline_tab_of_the_dag_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.types import TaskInstanceKey

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example:8080/")
    key = TaskInstanceKey(
        dag_id="flights", task_id="enrich", run_id="manual__2026/01 x", try_number=1
    )

    url = PipelineLink().get_link(
        FinalCheckpointStageOperator(task_id="enrich", transform=print), ti_key=key
    )

    assert url == (
        "http://airflow.example:8080/dags/flights/runs/manual__2026%2F01%20x"
        "/plugin/finalckpt-pipeline"
    )


def test_link_is_relative_without_a_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    assert pipeline_page_url("d", "r") == "/dags/d/runs/r/plugin/finalckpt-pipeline"


def test_stage_operator_and_plugin_carry_the_link() -> None:
    op = FinalCheckpointStageOperator(task_id="ingest", transform=print, splits=["a"])

    assert [link.name for link in op.operator_extra_links] == ["Pipeline"]
    assert PipelineLink().operators == [FinalCheckpointStageOperator]


def test_serialized_stage_task_keeps_the_link() -> None:
    """The api-server renders links from the serialized DAG; the plugin's link (matched by the
    operator class) wins over the XCom-stored copy, so the link works while the task runs."""
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("link_dag", schedule=None) as dag:
        FinalCheckpointStageOperator(task_id="ingest", transform=print, splits=["a"])
    restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    task = restored.get_task("ingest")

    assert task.extra_links == ["Pipeline"]
    assert isinstance(task.operator_extra_link_dict["Pipeline"], PipelineLink)
