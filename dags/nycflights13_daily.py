"""Scheduled example: one run per day of 2013, each replacing its day in four tables.

read_day (the day's input files, from the run's data interval) -> publish (the day's flights to
Parquet, SQL, Iceberg and Delta; each sink owns ``event_date = {{ data_interval_start | ds }}``,
so a rerun, a backfill or a new run of a day replaces that day, exactly once). See
docs/scheduling.md.

Environment knobs (all optional):
  FINALCKPT_EXAMPLE_DAILY_INPUT   the day files (default $AIRFLOW_HOME/finalckpt/daily_input)
  FINALCKPT_EXAMPLE_DAILY_OUTPUT  the four tables (default $AIRFLOW_HOME/finalckpt/daily)
  FINALCKPT_EXAMPLE_SQL_URL       the SQL sink database (default SQLite in the output directory)
"""

from __future__ import annotations

from airflow_finalckpt.examples.nycflights13.daily import build_daily_dag, env_daily_settings

dag = build_daily_dag("nycflights13_daily", **env_daily_settings())
