"""Route totals: an aggregation over every day of the input as an example DAG factory
(``dags/nycflights13_route_totals.py``).

::

    prepare_input >> ingest (flights, one split per day) >> route_totals

``route_totals`` groups by route (origin, dest), whose flights span every day, so no batch holds
a whole group: it is written with ``IncrementalAggregate``. Each batch of ingested days is folded
into partial aggregates in keyed state; the stage's last batch (or its finish hook, on a drain)
emits one row per route, equal to the plain ``groupBy("origin", "dest").agg(...)`` over all days
whatever the batching, crashes and resumes. The table is published to Parquet and to a SQL table
upserted on the route (``key_columns``), both at the stage's final checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from airflow.sdk import DAG, Asset
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.examples.nycflights13 import stages
from airflow_finalckpt.examples.nycflights13.dag import example_dag, prepare_input_task
from airflow_finalckpt.examples.nycflights13.data import EVENT_TIME_COLUMN, open_layout
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.spark.aggregate import (
    IncrementalAggregate,
    count,
    count_distinct,
    first,
    last,
    max_,
    mean,
    sum_,
)

if TYPE_CHECKING:
    from airflow_finalckpt.spark.stage import BatchContext

ROUTE_KEYS = ("origin", "dest")
ROUTE_TOTALS = IncrementalAggregate(
    "route_totals",
    keys=ROUTE_KEYS,
    aggs={
        "flights": count(),
        "cancelled": sum_("cancelled"),
        "distance": sum_("distance"),
        "avg_arr_delay": mean("arr_delay"),
        "max_dep_delay": max_("dep_delay"),
        "carriers": count_distinct("carrier"),
        # the departure key (time, carrier, flight number) orders flights without ties
        "first_flight": first("flight_code", by="departure_key"),
        "last_flight": last("flight_code", by="departure_key"),
    },
)


def route_rows(flights: DataFrame) -> DataFrame:
    """The columns the route totals read, from ingested flights."""
    code = F.concat(F.col("carrier"), F.col("flight").cast("string"))
    departure = F.format_string(
        "%013d %s%05d", F.col(EVENT_TIME_COLUMN), F.col("carrier"), F.col("flight")
    )
    return flights.select(
        *ROUTE_KEYS,
        "distance",
        "arr_delay",
        "dep_delay",
        "carrier",
        F.col("dep_time").isNull().cast("long").alias("cancelled"),
        code.alias("flight_code"),
        departure.alias("departure_key"),
    )


def route_totals_transform(ctx: BatchContext) -> DataFrame | None:
    """Fold one batch of ingested days into the route totals (None until the input ends)."""
    return ROUTE_TOTALS.update(ctx, route_rows(ctx.read_parts()))


def route_totals_sinks(
    output_dir: str, sql_url: str | None = None
) -> list[ParquetTableSink | SqlTableSink]:
    """The Parquet table and the SQL table (upserted on the route) of the route totals."""
    if sql_url is None:  # the SQLite sink's directory must exist when it first connects
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    return [
        ParquetTableSink("route_totals_parquet", f"{output_dir}/route_totals"),
        SqlTableSink(
            "route_totals_sql",
            sql_url or f"sqlite:///{output_dir}/route_totals.db",
            "route_totals",
            key_columns=ROUTE_KEYS,
        ),
    ]


def build_route_totals_dag(
    dag_id: str = "nycflights13_route_totals",
    *,
    input_dir: str,
    output_dir: str,
    sql_url: str | None = None,
    days: int = 365,
    retries: int = 2,
    batch_sizes: Mapping[str, int | str] | None = None,
    doc_md: str | None = None,
) -> DAG:
    """The route totals DAG (see the module docstring).

    :param batch_sizes: per stage, a fixed split count instead of the default ``"auto"``.
    """
    sizes = dict(batch_sizes or {})
    with example_dag(dag_id, retries, doc_md or __doc__) as dag:
        prepare_input = prepare_input_task(input_dir, output_dir, days)

        @finalckpt_stage(
            splits=lambda: open_layout(input_dir).split_ids,
            split_bytes=stages.ingest_split_bytes(input_dir),
            batch_size=sizes.get("ingest", "auto"),
        )
        def ingest(ctx: BatchContext) -> DataFrame | None:
            return stages.ingest_transform(input_dir)(ctx)

        @finalckpt_stage(
            batch_size=sizes.get("route_totals", "auto"),
            commit_mode="final",
            outlets=[Asset("nycflights13_route_totals")],
            sinks=route_totals_sinks(output_dir, sql_url),
        )
        def route_totals(ctx: BatchContext) -> DataFrame | None:
            return route_totals_transform(ctx)

        route_totals.finish(ROUTE_TOTALS.result)  # a drain: emit the routes read so far

        prepare_input >> ingest() >> route_totals()
    return dag
