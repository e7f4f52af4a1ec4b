"""Asset events mark commits, exactly once: the stage's Asset event is emitted by the DAG run
whose attempt committed (with the checkpoint id and the rows in its extra), never again by a
continuation run in which the CLOSED stage only re-publishes its end_of_data (that re-emission
made Asset-scheduled DAGs run twice on no new data). Real ``dag.test()`` with a Parquet sink;
the events are read from Airflow's metadata database, where the scheduler reads them."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ONE_STAGE_DAG = """
from datetime import datetime

from airflow.sdk import DAG, Asset

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink


def rows(ctx):
    return ctx.spark.createDataFrame([(s,) for s in ctx.splits], "k string")


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(
        task_id="publish",
        transform=rows,
        splits=["s1", "s2", "s3"],
        batch_size=2,
        outlets=[Asset(ASSET)],
        sinks=[ParquetTableSink("out", OUT_DIR)],
        retries=0,
    )

with DAG(DAG_ID + "_consumer", schedule=[Asset(ASSET)], start_date=datetime(2026, 1, 1)):
    pass
"""


@pytest.fixture
def settings(airflow_home: Any, spark: Any, local_store: Path) -> Path:
    return local_store


def asset_events(name: str) -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.name == name)
            .order_by(AssetEvent.id)
        ).all()
        return [dict(e.extra or {}) for e in events]


def test_one_asset_event_per_commit_none_for_a_republish(
    settings: Path, write_dag: Callable[..., Any]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    asset, key = f"finalckpt_test_{suffix}", f"assets.{suffix}"
    dag = write_dag(
        ONE_STAGE_DAG, DAG_ID=f"assets_{suffix}", ASSET=asset, OUT_DIR=str(settings / "out")
    )

    first = dag.test(run_conf={"pipeline_key": key})
    assert str(first.state).endswith("success")
    events = asset_events(asset)
    assert len(events) == 1
    assert events[0]["pipeline_key"] == key and events[0]["stage_id"] == "publish"
    assert isinstance(events[0]["checkpoint_id"], int)
    assert events[0]["rows"] == 3 and events[0]["rows_by_sink"] == {"out": 3}

    # a continuation run: the stage is CLOSED, it re-publishes its end_of_data and succeeds,
    # but nothing new was committed, so no Asset event (the consumer DAG must not run again)
    again = dag.test(run_conf={"pipeline_key": key})
    assert str(again.state).endswith("success")
    assert asset_events(asset) == events
