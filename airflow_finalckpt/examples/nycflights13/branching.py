"""The branching example pipeline as a DAG factory: ``dags/nycflights13_branching.py`` builds the
DAG the README runs; tests build more copies of it, each with its own input and output, and pace
its branches with ``batch_hooks``.

::

    prepare_input >> [ingest, weather] >> enrich >> delay_windows >> publish
                                          enrich >> carrier_daily

- ``ingest`` (flights, one split per day) and ``weather`` (the weather dimension, one split per
  origin airport: EWR, JFK, LGA) are two sources Airflow runs at the same time;
- ``enrich`` fans them in: its splits are ingest's output parts; the weather it joins is the
  ``weather`` stage's whole output (``ctx.upstream("weather")``), the other dimension tables
  are read from files once per attempt;
- two branches of different length follow: ``delay_windows`` (hourly event-time windows per
  origin) >> ``publish`` (Parquet table + SQL table), and ``carrier_daily`` (flights, cancelled
  flights and average departure delay per carrier and day), which publishes its own Parquet
  table. Both publish at their final checkpoint (``commit_mode="final"``).
- with ``lakehouse=True`` both publishing stages also write their table to Apache Iceberg
  (``nycflights13.<table>`` in a SQLite-catalog warehouse under the output directory) and to
  Delta Lake (``<output>/delta/<table>``), committed at the same final checkpoint
  (``branching_sinks`` lists them, so the runner checks exactly what the DAG writes).

When the short branch finishes while the long one still runs, its final checkpoint needs the
running stages' acknowledgements: the task defers to ``FinalCheckpointTrigger`` (no worker slot)
until a running sibling acknowledges at its next batch boundary, then commits and succeeds. The
checkpoints of that moment hold finished, partially finished and not started stages side by side
(FLIP-147). ``dag.test()`` runs the same DAG serially.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from airflow.sdk import DAG, Asset

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.examples.nycflights13 import stages, transforms
from airflow_finalckpt.examples.nycflights13.dag import (
    BatchHook,
    example_dag,
    prepare_input_task,
    run_hooks,
)
from airflow_finalckpt.examples.nycflights13.data import DIMS_DIR, open_layout
from airflow_finalckpt.examples.nycflights13.transforms import load_dim
from airflow_finalckpt.sinks import (
    DeltaTableSink,
    IcebergTableSink,
    ParquetTableSink,
    SqlTableSink,
)
from airflow_finalckpt.sizing import file_bytes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
    from airflow_finalckpt.spark.stage import BatchContext, Transform

#: The splits of the ``weather`` source: the three New York origin airports.
ORIGINS = ("EWR", "JFK", "LGA")
#: The dimension tables enrich reads from files (weather comes from the ``weather`` stage).
FILE_DIMS = ("airlines", "airports", "planes")
STAGE_IDS = ("ingest", "weather", "enrich", "delay_windows", "publish", "carrier_daily")
#: The Iceberg namespace of the lakehouse tables.
ICEBERG_NAMESPACE = "nycflights13"
#: Sink kinds: the classic pair (always written) and the lakehouse table formats (optional).
CLASSIC_SINKS = ("parquet", "sql")
LAKEHOUSE_SINKS = ("iceberg", "delta")


def branching_sinks(
    output_dir: str, sql_url: str | None = None, *, lakehouse: bool = False
) -> dict[str, list[TwoPhaseCommitSink]]:
    """The sinks of the two publishing stages, per table (``delay_windows`` is written by
    ``publish``, ``carrier_daily`` by ``carrier_daily``): Parquet tables, the SQL table of the
    delay windows, and with ``lakehouse`` an Iceberg table (SQLite catalog in
    ``<output>/warehouse``) and a Delta table (``<output>/delta/<table>``) for each.
    """
    if sql_url is None:  # the SQLite sink's directory must exist when it first connects
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        sql_url = f"sqlite:///{output_dir}/delay_windows.db"
    sinks: dict[str, list[TwoPhaseCommitSink]] = {
        "delay_windows": [
            ParquetTableSink("delay_windows_parquet", f"{output_dir}/delay_windows"),
            SqlTableSink("delay_windows_sql", sql_url, "delay_windows"),
        ],
        "carrier_daily": [
            ParquetTableSink("carrier_daily_parquet", f"{output_dir}/carrier_daily"),
        ],
    }
    if lakehouse:
        for table, table_sinks in sinks.items():
            table_sinks.append(
                IcebergTableSink(
                    f"{table}_iceberg",
                    f"{ICEBERG_NAMESPACE}.{table}",
                    warehouse=f"{output_dir}/warehouse",
                )
            )
            table_sinks.append(DeltaTableSink(f"{table}_delta", f"{output_dir}/delta/{table}"))
    return sinks


def weather_transform(input_dir: str) -> Transform:
    """The weather stage's transform: the weather rows of the batch's origin airports."""

    def transform(ctx: BatchContext) -> DataFrame:
        layout = stages.input_layout(ctx, input_dir)
        return transforms.weather_by_origin(ctx.spark, layout, ctx.splits)

    return transform


def weather_file(input_dir: str, _origin: str) -> str:
    """The file every weather split reads whole (filtered to its origin airport)."""
    return str(Path(input_dir) / DIMS_DIR / "weather.parquet")


def enrich_transform(input_dir: str) -> Transform:
    """Fan-in: flights (this batch's ingest parts) joined with the dimension files and with the
    ``weather`` stage's whole output, all built and key-checked once per stage attempt.
    """

    def transform(ctx: BatchContext) -> DataFrame:
        layout = stages.input_layout(ctx, input_dir)
        # from the attempt's second batch on held on the driver (``broadcast_table``)
        dims = {
            name: ctx.broadcast_table(name, partial(load_dim, ctx.spark, layout, name))
            for name in FILE_DIMS
        }
        dims["weather"] = ctx.broadcast_table("weather", lambda: ctx.upstream("weather"))
        ctx.attempt_value("dims_verified", partial(transforms.verify_dims, dims))
        return transforms.enrich(ctx.spark, ctx.read_parts(), dims, verify_keys=False)

    return transform


def carrier_daily_transform(ctx: BatchContext) -> DataFrame:
    """Flights, cancellations and mean departure delay per carrier and day, from enriched parts."""
    return transforms.carrier_daily(ctx.read_parts())


def build_branching_dag(
    dag_id: str = "nycflights13_branching",
    *,
    input_dir: str,
    output_dir: str,
    sql_url: str | None = None,
    days: int = 365,
    retries: int = 2,
    batch_sizes: Mapping[str, int | str] | None = None,
    spark_conf: Mapping[str, str] | None = None,
    batch_hooks: Mapping[str, BatchHook] | None = None,
    windows_asset: str = "nycflights13_delay_windows",
    carrier_asset: str = "nycflights13_carrier_daily",
    lakehouse: bool = False,
    doc_md: str | None = None,
) -> DAG:
    """The branching example DAG (see the module docstring).

    :param sql_url: the SQL sink database of ``publish`` (default: SQLite in ``output_dir``).
    :param batch_sizes: per stage, a fixed split count instead of the default ``"auto"``
        (tests that need a known batch structure).
    :param spark_conf: Spark settings of every stage's session (the operator's ``spark_conf``).
    :param batch_hooks: per stage id, a hook run at the start of each of its batches (tests pace
        the branches with it, or block until the test lets the batch go on; the demo's
        ``crash.crash_hook`` fails enrich mid-way).
    :param lakehouse: also publish both tables to Iceberg and Delta Lake (``branching_sinks``;
        needs the ``lakehouse`` extra: pyiceberg, deltalake).
    """
    sinks = branching_sinks(output_dir, sql_url, lakehouse=lakehouse)
    sizes = dict(batch_sizes or {})
    conf = dict(spark_conf or {})
    enrich_logic = enrich_transform(input_dir)
    hooks = dict(batch_hooks or {})
    with example_dag(dag_id, retries, doc_md or __doc__) as dag:
        prepare_input = prepare_input_task(input_dir, output_dir, days)

        @finalckpt_stage(
            spark_conf=conf,
            splits=lambda: open_layout(input_dir).split_ids,
            split_bytes=stages.ingest_split_bytes(input_dir),
            batch_size=sizes.get("ingest", "auto"),
        )
        def ingest(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return stages.ingest_transform(input_dir)(ctx)

        @finalckpt_stage(
            splits=list(ORIGINS),
            split_bytes=file_bytes(partial(weather_file, input_dir)),
            batch_size=sizes.get("weather", "auto"),
            spark_conf=conf,
        )
        def weather(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return weather_transform(input_dir)(ctx)

        @finalckpt_stage(
            primary_input="ingest", batch_size=sizes.get("enrich", "auto"), spark_conf=conf
        )
        def enrich(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return enrich_logic(ctx)

        @finalckpt_stage(batch_size=sizes.get("delay_windows", "auto"), spark_conf=conf)
        def delay_windows(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return stages.windows_transform(ctx)

        @delay_windows.finish
        def _fire_all_windows(ctx: BatchContext) -> DataFrame | None:
            return stages.windows_finish(ctx)

        @finalckpt_stage(
            spark_conf=conf,
            batch_size=sizes.get("publish", "auto"),
            commit_mode="final",
            # The task succeeds only after its sinks committed: the asset event marks
            # committed data.
            outlets=[Asset(windows_asset)],
            sinks=sinks["delay_windows"],
        )
        def publish(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return stages.publish_transform(ctx)

        @finalckpt_stage(
            spark_conf=conf,
            batch_size=sizes.get("carrier_daily", "auto"),
            # each split (an enrich part) holds whole days: the (day, carrier) groups never
            # span batches, so the groupBy stays batched (checked at run time per batch)
            split_keys=("day",),
            commit_mode="final",
            outlets=[Asset(carrier_asset)],
            sinks=sinks["carrier_daily"],
        )
        def carrier_daily(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return carrier_daily_transform(ctx)

        enriched = enrich()
        prepare_input >> [ingest(), weather()] >> enriched
        enriched >> delay_windows() >> publish()
        enriched >> carrier_daily()
    return dag
