"""Incremental example: a writer appends days of flights to an Iceberg table, one snapshot per
day; each run of the DAG reads only the snapshots appended since the last committed run
(``IcebergAppends``) and publishes their daily rollup per carrier (flights, cancelled flights,
mean departure delay) to a Parquet table. See docs/sources.md.

read_new_days (splits: the data files the new append snapshots added; the rollup of the batch)
with ``commit_mode="final"``. The writer appends whole days, so a day's rollup is computed from
all of its flights in one run. A groupBy is not split-local: the stage runs its range as one
batch per attempt (docs/protocol.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow.parquet as pq
from airflow.sdk import DAG

from airflow_finalckpt.examples.nycflights13.data import (
    FLIGHTS_DIR,
    split_file_name,
    split_id_for,
)
from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.sources import IcebergAppends

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_finalckpt.spark.stage import BatchContext

#: The Iceberg table the writer appends to (in a SQLite catalog under the warehouse).
TABLE = "nycflights13.flights_feed"
KEYS = ("year", "month", "day", "carrier")


def _catalog(warehouse: str) -> Any:
    from pyiceberg.catalog import load_catalog

    Path(warehouse).mkdir(parents=True, exist_ok=True)
    return load_catalog(
        "finalckpt", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=warehouse
    )


def append_days(warehouse: str, input_dir: str, days: Sequence[date]) -> None:
    """The writer: append each day's flights (``data.prepare_inputs`` files) as one snapshot."""
    catalog = _catalog(warehouse)
    catalog.create_namespace_if_not_exists(TABLE.split(".")[0])
    for day in days:
        path = Path(input_dir) / FLIGHTS_DIR / split_file_name(split_id_for(day))
        rows = pq.read_table(path)
        if not catalog.table_exists(TABLE):
            catalog.create_table(TABLE, schema=rows.schema)
        catalog.load_table(TABLE).append(rows)


def rollup(ctx: BatchContext) -> DataFrame:
    """The daily rollup per carrier of the new days' flights."""
    from pyspark.sql import functions as F

    flights = ctx.spark.read.parquet(*ctx.splits)
    return flights.groupBy(*KEYS).agg(
        F.count(F.lit(1)).alias("flights"),
        F.sum(F.col("dep_time").isNull().cast("long")).alias("cancelled"),
        F.avg("dep_delay").alias("mean_dep_delay"),
    )


def reference_rollup(input_dir: str, days: Sequence[date]) -> pd.DataFrame:
    """The same rollup computed by pandas from the input files (the independent check)."""
    frames = [
        pd.read_parquet(Path(input_dir) / FLIGHTS_DIR / split_file_name(split_id_for(d)))
        for d in days
    ]
    flights = pd.concat(frames, ignore_index=True)
    grouped = flights.groupby(list(KEYS), as_index=False)
    return grouped.agg(
        flights=("carrier", "size"),
        cancelled=("dep_time", lambda s: int(s.isna().sum())),
        mean_dep_delay=("dep_delay", "mean"),
    )


def build_incremental_dag(
    dag_id: str, *, warehouse: str, output_dir: str, schedule: str | None = None
) -> DAG:
    """The DAG: each run reads the appends since the last committed run and publishes them."""
    with DAG(
        dag_id,
        schedule=schedule,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,  # runs of one source are serialized, never refused (sources.md)
        tags=["finalckpt", "example"],
    ) as dag:
        FinalCheckpointStageOperator(
            task_id="read_new_days",
            transform=rollup,
            splits=IcebergAppends(TABLE, warehouse=warehouse),
            commit_mode="final",
            sinks=[ParquetTableSink("daily_rollup", str(Path(output_dir) / "daily_rollup"))],
        )
    return dag


def env_incremental_settings() -> dict[str, str]:
    """The example's paths from the environment (defaults under $AIRFLOW_HOME/finalckpt)."""
    home = Path(os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))) / "finalckpt"
    return {
        "warehouse": os.environ.get("FINALCKPT_EXAMPLE_FEED_WAREHOUSE", str(home / "feed")),
        "output_dir": os.environ.get("FINALCKPT_EXAMPLE_FEED_OUTPUT", str(home / "incremental")),
    }
