"""A partitioned producer and a partition-driven consumer for
tests/e2e/test_partitioned_assets.py.

- ``finalckpt_e2e_part_producer``: ``CronPartitionTimetable`` daily (keys ``YYYY-MM-DD``),
  over a past range only (backfills create its runs). One stage reads the partition's input
  files (``<work>/input/<key>/*.json``, one split each, batches of one) and commits their rows
  to a Parquet table owning ``day = <partition key>`` (``partition_slice``); its Asset gets one
  partitioned event per commit. The stage waits in its second batch while ``<work>/hold`` names
  its partition, so the test can SIGKILL it mid-run.
- ``finalckpt_e2e_part_consumer``: ``PartitionedAssetTimetable`` (identity mapper); its task
  reads the committed rows of its partition and writes them, with the events that triggered
  it, to ``<work>/consumed/<run id>.json``.
- ``finalckpt_e2e_hourly_producer`` (``PartitionedAtRuntime``): one stage commits the hourly
  rows of ``<work>/hourly/*.json`` and names their hours with ``ctx.add_partitions``; each
  committed hour gets one event. ``finalckpt_e2e_daily_rollup``: ``RollupMapper``
  (``StartOfDayMapper`` + ``DayWindow``, ``WaitForAll``): one run per complete day.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import (
    DAG,
    Asset,
    CronPartitionTimetable,
    DayWindow,
    PartitionedAssetTimetable,
    PartitionedAtRuntime,
    RollupMapper,
    StartOfDayMapper,
    WaitForAll,
    task,
)

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink, partition_slice

WORK = Path(os.environ.get("FINALCKPT_E2E_WORK", "/tmp/finalckpt-e2e-partitions"))
ASSET = Asset("finalckpt_e2e_partitioned_rows")
PRODUCER = "finalckpt_e2e_part_producer"
CONSUMER = "finalckpt_e2e_part_consumer"
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}


def table() -> ParquetTableSink:
    return ParquetTableSink("rows", str(WORK / "rows"), replace_slice=partition_slice("day"))


def partition_files(run: Any) -> list[str]:
    folder = WORK / "input" / str(run.partition_key)
    return sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []


def _hold(ctx: Any) -> None:
    marker = WORK / "hold"
    if not marker.exists() or marker.read_text().strip() != ctx.partition_key:
        return
    if list(ctx.splits) == partition_files(ctx.run)[:1]:
        return  # the first batch is recorded; the kill lands in the second
    (WORK / "held").write_text(str(os.getpid()))
    deadline = time.monotonic() + 300
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def read_partition(ctx: Any) -> Any:
    _hold(ctx)
    folder = WORK / "input" / ctx.partition_key
    rows = [
        (ctx.partition_key, str(item), int(amount))
        for name in ctx.splits
        for item, amount in json.loads((folder / name).read_text())
    ]
    return ctx.spark.createDataFrame(rows, "day string, item string, amount long")


with DAG(
    PRODUCER,
    schedule=CronPartitionTimetable("0 0 * * *", timezone="UTC", key_format="%Y-%m-%d"),
    start_date=datetime(2026, 3, 1),
    end_date=datetime(2026, 3, 10),
    catchup=False,
    max_active_runs=3,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=1)},
) as producer:
    FinalCheckpointStageOperator(
        task_id="publish",
        transform=read_partition,
        splits=partition_files,
        batch_size=1,
        commit_mode="final",
        outlets=[ASSET],
        sinks=[table()],
        spark_conf=SPARK_CONF,
    )


with DAG(
    CONSUMER,
    schedule=PartitionedAssetTimetable(assets=ASSET),
    start_date=datetime(2026, 3, 1),
    catchup=False,
) as consumer:

    @task
    def consume(**context: Any) -> None:
        key = context["partition_key"]
        committed = table().read_pandas()
        mine = committed[committed["day"] == key] if len(committed) else committed
        events = [
            {"partition_key": event.partition_key, "source_run_id": event.source_run_id}
            for events in context["triggering_asset_events"].values()
            for event in events
        ]
        out = WORK / "consumed"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{context['run_id']}.json").write_text(
            json.dumps(
                {
                    "partition_key": key,
                    "rows": sorted([r.item, int(r.amount)] for r in mine.itertuples()),
                    "events": events,
                }
            )
        )

    consume()


#: Hourly partitions named at run time (``PartitionedAtRuntime``): one run of this producer
#: commits the hours its input lists and announces each committed hour once; the rollup
#: consumer runs once per complete day (24 hourly partitions of it).
HOURLY_ASSET = Asset("finalckpt_e2e_hourly_rows")
HOURLY = "finalckpt_e2e_hourly_producer"
ROLLUP = "finalckpt_e2e_daily_rollup"


def hourly_splits() -> list[str]:
    folder = WORK / "hourly"
    return sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []


def read_hours(ctx: Any) -> Any:
    rows = [
        (str(hour), int(amount))
        for name in ctx.splits
        for hour, amount in json.loads((WORK / "hourly" / name).read_text())
    ]
    ctx.add_partitions(sorted({hour for hour, _ in rows}))
    return ctx.spark.createDataFrame(rows, "hour string, amount long")


with DAG(
    HOURLY, schedule=PartitionedAtRuntime(), start_date=datetime(2026, 3, 1), catchup=False
) as hourly:
    FinalCheckpointStageOperator(
        task_id="land",
        transform=read_hours,
        splits=hourly_splits,
        batch_size=1,
        commit_mode="final",
        outlets=[HOURLY_ASSET],
        sinks=[ParquetTableSink("hours", str(WORK / "hours"))],
        spark_conf=SPARK_CONF,
        retries=1,
    )


with DAG(
    ROLLUP,
    schedule=PartitionedAssetTimetable(
        assets=HOURLY_ASSET,
        default_partition_mapper=RollupMapper(
            upstream_mapper=StartOfDayMapper(), window=DayWindow(), wait_policy=WaitForAll()
        ),
    ),
    start_date=datetime(2026, 3, 1),
    catchup=False,
) as rollup:

    @task
    def roll_up(**context: Any) -> None:
        keys = sorted(
            str(event.partition_key)
            for events in context["triggering_asset_events"].values()
            for event in events
        )
        out = WORK / "rolled"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{context['run_id']}.json").write_text(
            json.dumps({"partition_key": context["partition_key"], "hours": keys})
        )

    roll_up()
