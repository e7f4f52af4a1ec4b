"""Partitioned example: one producer run per day partition of 2013, each replacing its day in
four tables and announcing it with one partitioned Asset event at the commit; a consumer runs
once per committed partition. See docs/scheduling.md ("Partitions").

Environment knobs (all optional, shared with nycflights13_daily):
  FINALCKPT_EXAMPLE_DAILY_INPUT   the day files (default $AIRFLOW_HOME/finalckpt/daily_input)
  FINALCKPT_EXAMPLE_PARTITIONED_OUTPUT  the tables (default $AIRFLOW_HOME/finalckpt/partitioned)
  FINALCKPT_EXAMPLE_SQL_URL       the SQL sink database (default SQLite in the output directory)
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_finalckpt.examples.nycflights13.daily import env_daily_settings
from airflow_finalckpt.examples.nycflights13.partitioned import (
    build_consumer_dag,
    build_producer_dag,
)

settings = env_daily_settings()
home = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "finalckpt"
settings["output_dir"] = os.environ.get(
    "FINALCKPT_EXAMPLE_PARTITIONED_OUTPUT", str(home / "partitioned")
)
dag = build_producer_dag("nycflights13_partitioned", **settings)
consumer = build_consumer_dag(
    "nycflights13_partitioned_carriers", output_dir=settings["output_dir"]
)
