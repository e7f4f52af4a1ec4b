"""The example pipeline as a DAG factory: ``dags/nycflights13_pipeline.py`` builds the DAG users
run; tests build more copies of it, each with its own input and output, and pass their pacing or
injected crashes as ``batch_hooks`` (never the DAG files).

prepare_input -> ingest (one split per day) -> enrich (broadcast join with airlines, airports,
planes, weather) -> delay_windows (hourly event-time windows per origin airport) -> publish
(Parquet table and SQL table, committed exactly once at the final checkpoint).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from airflow.sdk import DAG, Asset, task

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.examples.nycflights13 import stages
from airflow_finalckpt.examples.nycflights13.data import first_days, open_layout, prepare_inputs
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_finalckpt.spark.stage import BatchContext


#: Runs at the start of every batch of one stage, before its transform (what tests pace
#: branches or inject crashes with: see ``crash.crash_hook``).
BatchHook: TypeAlias = Callable[["BatchContext"], None]


def env_settings() -> dict[str, Any]:
    """The example DAG files' input, output and days from ``FINALCKPT_EXAMPLE_*`` (see their
    docstrings).
    """
    home = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "finalckpt"
    return {
        "input_dir": os.environ.get("FINALCKPT_EXAMPLE_INPUT", str(home / "input")),
        "output_dir": os.environ.get("FINALCKPT_EXAMPLE_OUTPUT", str(home / "output")),
        "sql_url": os.environ.get("FINALCKPT_EXAMPLE_SQL_URL"),
        "days": int(os.environ.get("FINALCKPT_EXAMPLE_DAYS", "365")),
    }


def run_hooks(hooks: Mapping[str, BatchHook], ctx: BatchContext) -> None:
    """Run the batch hook of ``ctx``'s stage, if it has one."""
    hook = hooks.get(ctx.stage_id)
    if hook is not None:
        hook(ctx)


def example_dag(dag_id: str, retries: int, doc_md: str | None) -> DAG:
    """The DAG both example pipelines are built in (manual runs, short retry delay)."""
    return DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        default_args={"retries": retries, "retry_delay": timedelta(seconds=2)},
        tags=["finalckpt", "example"],
        doc_md=doc_md,
    )


def prepare_input_task(input_dir: str, output_dir: str, days: int) -> Any:
    """The ``prepare_input`` task of both example DAGs, returning the day split ids."""

    @task
    def prepare_input() -> list[str]:
        """Write one Parquet file per day and the dimension files (idempotent)."""
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        return list(prepare_inputs(input_dir, days=first_days(days)).split_ids)

    return prepare_input()


def build_dag(
    dag_id: str = "nycflights13_pipeline",
    *,
    input_dir: str,
    output_dir: str,
    sql_url: str | None = None,
    days: int = 365,
    retries: int = 2,
    asset: str = "nycflights13_delay_windows",
    doc_md: str | None = None,
    batch_sizes: Mapping[str, int | str] | None = None,
    batch_hooks: Mapping[str, BatchHook] | None = None,
) -> DAG:
    """The example pipeline DAG.

    :param sql_url: the SQL sink database (default: SQLite in ``output_dir``).
    :param batch_sizes: per stage, a fixed split count instead of the default ``"auto"``
        (tests that need a known batch structure).
    :param batch_hooks: per stage id, a hook run at the start of each of its batches (tests:
        pacing, so that a stop or a kill lands mid-way; the demo's injected crash).
    """
    if sql_url is None:  # the SQLite sink's directory must exist when it first connects
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        sql_url = f"sqlite:///{output_dir}/delay_windows.db"
    sizes = dict(batch_sizes or {})
    hooks = dict(batch_hooks or {})
    with example_dag(dag_id, retries, doc_md or __doc__) as dag:
        prepare_input = prepare_input_task(input_dir, output_dir, days)

        @finalckpt_stage(
            splits=lambda: open_layout(input_dir).split_ids,
            split_bytes=stages.ingest_split_bytes(input_dir),
            batch_size=sizes.get("ingest", "auto"),
        )
        def ingest(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return stages.ingest_transform(input_dir)(ctx)

        @finalckpt_stage(batch_size=sizes.get("enrich", "auto"))
        def enrich(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return stages.enrich_transform(input_dir)(ctx)

        @finalckpt_stage(batch_size=sizes.get("delay_windows", "auto"))
        def delay_windows(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return stages.windows_transform(ctx)

        @delay_windows.finish
        def _fire_all_windows(ctx: BatchContext) -> DataFrame | None:
            return stages.windows_finish(ctx)

        @finalckpt_stage(
            batch_size=sizes.get("publish", "auto"),
            commit_mode="final",
            # The task succeeds only after its sinks committed: the asset event marks
            # committed data.
            outlets=[Asset(asset)],
            sinks=[
                ParquetTableSink("delay_windows_parquet", f"{output_dir}/delay_windows"),
                SqlTableSink("delay_windows_sql", sql_url, "delay_windows"),
            ],
        )
        def publish(ctx: BatchContext) -> DataFrame | None:
            run_hooks(hooks, ctx)
            return stages.publish_transform(ctx)

        prepare_input >> ingest() >> enrich() >> delay_windows() >> publish()
    return dag
