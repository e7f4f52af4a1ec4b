"""Partitioned DAG runs (AIP-76) on a real Airflow with ``dag.test()``: a stage sees its run's
partition key and date (in ``ctx`` and the ``splits`` callable), a sink owns the partition's
slice from a composite key (``partition_slice``, rendered by Airflow), a rerun of a partition
replaces its rows, and every commit is announced by exactly one partitioned Asset event (none
on a re-publish; one per committed key a stage reports at run time).

Airflow 3.3's ``dag.test()`` has no partition argument: ``partitioned()`` gives the DAG run it
creates a partition key and date, as the scheduler does for a ``CronPartitionTimetable`` run or
a run triggered with ``partition_key``; everything after (the task context, the execution API,
the Asset events in the metadata database) is Airflow's own (``tests/partitioned_runs.py``)."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.partitioned_runs import asset_events, partitioned

pytestmark = pytest.mark.slow

COMPOSITE_DAG = """
import json
from datetime import datetime

from airflow.sdk import DAG, Asset, PartitionedAtRuntime

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import SqlTableSink, partition_slice


def region_day(ctx):
    region, day = ctx.partition_key.split("|")
    values = json.load(open(INPUT))[ctx.partition_key]
    date = None if ctx.partition_date is None else ctx.partition_date.isoformat()
    return ctx.spark.createDataFrame(
        [(region, day, v, s, ctx.partition_key, date) for s in ctx.splits for v in values],
        "region string, day string, v long, split string, pk string, pdate string",
    )


SLICE = partition_slice("region", "day")  # from a composite key "us|2026-03-10"

with DAG(DAG_ID, schedule=PartitionedAtRuntime(), start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(
        task_id="sales",
        transform=region_day,
        splits=lambda run: [run.partition_key.replace("|", "-") + ".json"],
        commit_mode="final",
        outlets=[Asset(ASSET)],
        sinks=[SqlTableSink("out", SINK_URL, "sales", replace_slice=SLICE)],
        retries=0,
    )
"""

RUNTIME_KEYS_DAG = """
from datetime import datetime

from airflow.sdk import DAG, Asset, PartitionedAtRuntime

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink


def landing(ctx):
    ctx.add_partitions(sorted({s.split("/")[0] for s in ctx.splits}))
    return ctx.spark.createDataFrame([(s,) for s in ctx.splits], "split string")


with DAG(DAG_ID, schedule=PartitionedAtRuntime(), start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(
        task_id="land",
        transform=landing,
        splits=["2026-03-10/a", "2026-03-10/b", "2026-03-11/a"],
        batch_size=1,
        outlets=[Asset(ASSET)],
        sinks=[ParquetTableSink("out", OUT_DIR)],
        retries=0,
    )
"""


@pytest.fixture
def settings(airflow_home: Any, spark: Any, local_store: Path) -> Path:
    return local_store


def _day(n: int) -> dt.datetime:
    return dt.datetime(2026, 3, n, tzinfo=dt.UTC)


def _rows(sink: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(sink) as conn:
        return sorted(conn.execute("SELECT region, day, v, split, pk, pdate FROM sales"))


def test_a_partition_is_seen_owned_replaced_and_announced_once_per_commit(
    settings: Path, write_dag: Callable[..., Any]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    asset, inputs, sink = f"finalckpt_part_{suffix}", settings / "in.json", settings / "sink.db"
    inputs.write_text(json.dumps({"us|2026-03-10": [1, 2], "eu|2026-03-10": [3]}))
    dag = write_dag(
        COMPOSITE_DAG,
        DAG_ID=f"partitions_{suffix}",
        ASSET=asset,
        INPUT=str(inputs),
        SINK_URL=f"sqlite:///{sink}",
    )
    with partitioned("us|2026-03-10", _day(10)):
        us = dag.test(logical_date=_day(10))
    with partitioned("eu|2026-03-10"):
        assert str(dag.test(logical_date=_day(11)).state).endswith("success")
    assert str(us.state).endswith("success")
    when = _day(10).isoformat()
    assert _rows(sink) == [
        ("eu", "2026-03-10", 3, "eu-2026-03-10.json", "eu|2026-03-10", None),
        ("us", "2026-03-10", 1, "us-2026-03-10.json", "us|2026-03-10", when),
        ("us", "2026-03-10", 2, "us-2026-03-10.json", "us|2026-03-10", when),
    ]
    events = asset_events(asset)
    assert [key for key, _ in events] == ["us|2026-03-10", "eu|2026-03-10"]
    assert [extra["rows"] for _, extra in events] == [2, 1]
    first_key = events[0][1]["pipeline_key"]
    assert first_key.startswith(f"partitions_{suffix}.p=us-2026-03-10.manual__")

    # the partition's input changes: a new run of it replaces its slice (and only it)
    inputs.write_text(json.dumps({"us|2026-03-10": [7], "eu|2026-03-10": [3]}))
    with partitioned("us|2026-03-10", _day(10)):
        assert str(dag.test(logical_date=_day(12)).state).endswith("success")
    assert [r[:3] for r in _rows(sink)] == [("eu", "2026-03-10", 3), ("us", "2026-03-10", 7)]
    events = asset_events(asset)
    assert [key for key, _ in events] == ["us|2026-03-10", "eu|2026-03-10", "us|2026-03-10"]

    # a continuation of the first run's pipeline re-publishes: nothing new, no event
    with partitioned("us|2026-03-10", _day(10)):
        again = dag.test(logical_date=_day(13), run_conf={"pipeline_key": first_key})
    assert str(again.state).endswith("success")
    assert asset_events(asset) == events


def test_a_key_without_its_parts_fails_the_run_before_anything_is_written(
    settings: Path, write_dag: Callable[..., Any]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    asset, inputs, sink = f"finalckpt_part_{suffix}", settings / "in.json", settings / "sink.db"
    inputs.write_text(json.dumps({"us": [1]}))
    dag = write_dag(
        COMPOSITE_DAG,
        DAG_ID=f"partitions_bad_{suffix}",
        ASSET=asset,
        INPUT=str(inputs),
        SINK_URL=f"sqlite:///{sink}",
    )
    with partitioned("us"):  # no "|day": the slice template cannot render
        run = dag.test(logical_date=_day(10))
    assert str(run.state).endswith("failed")
    assert asset_events(asset) == []
    assert not sink.exists() or not _table_exists(sink)


def _table_exists(sink: Path) -> bool:
    with sqlite3.connect(sink) as conn:
        return bool(conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sales'").fetchall())


def test_runtime_partition_keys_are_announced_once_each_at_the_commit(
    settings: Path, write_dag: Callable[..., Any]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    asset = f"finalckpt_runtime_{suffix}"
    dag = write_dag(
        RUNTIME_KEYS_DAG, DAG_ID=f"runtime_{suffix}", ASSET=asset, OUT_DIR=str(settings / "out")
    )
    run = dag.test(logical_date=_day(10))
    assert str(run.state).endswith("success")
    events = asset_events(asset)
    assert sorted(key for key, _ in events) == ["2026-03-10", "2026-03-11"]
    assert all(extra["partition_keys"] == ["2026-03-10", "2026-03-11"] for _, extra in events)

    key = events[0][1]["pipeline_key"]
    again = dag.test(logical_date=_day(11), run_conf={"pipeline_key": key})
    assert str(again.state).endswith("success")
    assert asset_events(asset) == events  # a re-publish announces nothing
