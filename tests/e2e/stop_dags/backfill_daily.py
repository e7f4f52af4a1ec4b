"""A light copy of the scheduled example (``dags/nycflights13_daily.py``) for the backfill
end-to-end test (tests/e2e/test_clear_recompute_backfill.py), parsed by the stop tests' cluster.

One stage instead of two (each stage task starts a Spark session, and a backfill runs 7 days
twice): ``read_day`` reads the run's day files, one split per file in batches of one, and
publishes the day's flights to the example's four sinks (Parquet, SQL on SQLite, Iceberg,
Delta), each owning ``event_date = {{ data_interval_start | ds }}``. ``@daily`` over 2013 with
``catchup=False`` and an end in the past: the scheduler creates no run of its own, only the
backfills do. ``read_day`` can be held in the second batch of the day in ``<work>/backfill/hold``
(while that file exists) so the test kills it mid-batch.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, CronDataIntervalTimetable

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.examples.nycflights13.daily import (
    COLUMNS,
    daily_sinks,
    day_files,
    read_day_transform,
    run_day,
)

WORK = Path(os.environ.get("FINALCKPT_E2E_WORK", "/tmp/finalckpt-e2e-stop")) / "backfill"
INPUT = str(WORK / "input")
OUTPUT = str(WORK / "output")
BACKFILL_DAG = "finalckpt_e2e_backfill"


def _hold(ctx: Any) -> None:
    """While ``hold`` names this run's day, its batches after the first wait there (at most
    300 s): the test kills the task in the middle of the batch.
    """
    marker = WORK / "hold"
    if not marker.exists() or marker.read_text().strip() != run_day(ctx.run):
        return
    if list(ctx.splits) == day_files(INPUT, run_day(ctx.run))[:1]:
        return  # the first batch
    (WORK / "held").write_text(str(os.getpid()))
    deadline = time.monotonic() + 300
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


with DAG(
    BACKFILL_DAG,
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=datetime(2013, 1, 1),
    end_date=datetime(2014, 1, 1),
    catchup=False,
    max_active_runs=3,
    tags=["e2e"],
    # a killed try is retried; under load Airflow may also fail a try before it runs
    default_args={"retries": 3, "retry_delay": timedelta(seconds=1)},
):

    @finalckpt_stage(
        splits=lambda run: day_files(INPUT, run_day(run)),
        batch_size=1,
        commit_mode="final",
        sinks=daily_sinks(OUTPUT, f"sqlite:///{OUTPUT}/daily_flights.db"),
    )
    def read_day(ctx: Any) -> Any:
        _hold(ctx)
        return read_day_transform(INPUT, ctx).select(*COLUMNS)

    read_day()
