"""The daily DAG of tests/e2e/test_recreated_run.py (issue 38), parsed by the stop tests'
cluster: ``@daily`` (``CronDataIntervalTimetable``), ``read_day`` reads the run's day files
(one split each, one per batch), ``by_group`` joins them with a broadcast category -> group
dimension, sums per (day, group) and publishes to Parquet and a PostgreSQL table (the
coordination store's database), each owning the run's day, with an Asset per commit. The
schedule ended in 2014 and ``catchup=False``: only the test's backfills run it.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, CronDataIntervalTimetable

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink

WORK = Path(os.environ.get("FINALCKPT_E2E_WORK", "/tmp/finalckpt-e2e-stop")) / "recreated"
RECREATED_DAG = "finalckpt_e2e_recreated"
ASSET = Asset("finalckpt_e2e_recreated_groups")
DAY = {"event_date": "{{ data_interval_start | ds }}"}
PG_URL = os.environ.get("AIRFLOW__FINALCKPT__STORE_URL", "sqlite:////tmp/finalckpt-e2e.db")


def day_files(run: Any) -> list[str]:
    folder = WORK / "input" / f"day={run.ds}"
    return sorted(p.name for p in folder.glob("*.parquet")) if folder.is_dir() else []


with DAG(
    RECREATED_DAG,
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=datetime(2013, 1, 1),
    end_date=datetime(2014, 1, 1),
    catchup=False,
    max_active_runs=2,
    tags=["e2e"],
    default_args={
        "retries": 2,
        "retry_delay": timedelta(seconds=1),
        "spark_conf": {"spark.sql.shuffle.partitions": "2"},
    },
):

    @finalckpt_stage(splits=day_files, batch_size=1)
    def read_day(ctx: Any) -> Any:
        from pyspark.sql import functions as F

        files = [str(WORK / "input" / f"day={ctx.ds}" / s) for s in ctx.splits]
        return ctx.spark.read.parquet(*files).withColumn("event_date", F.to_date("event_date"))

    @finalckpt_stage(
        commit_mode="final",
        outlets=[ASSET],
        sinks=[
            ParquetTableSink("groups_parquet", str(WORK / "output" / "groups"), replace_slice=DAY),
            SqlTableSink("groups_pg", PG_URL, "recreated_groups", replace_slice=DAY),
        ],
    )
    def by_group(ctx: Any) -> Any:
        from pyspark.sql import functions as F

        groups = ctx.broadcast_table(
            "groups", lambda: ctx.spark.read.parquet(str(WORK / "input" / "groups.parquet"))
        )
        events = ctx.read_parts().join(groups, "category", "left")
        return events.groupBy("event_date", "group").agg(
            F.count("*").alias("events"), F.sum("amount").alias("amount")
        )

    read_day() >> by_group()
