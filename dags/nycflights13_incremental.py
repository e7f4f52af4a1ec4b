"""Incremental example: each run reads the Iceberg snapshots a writer appended since the last
committed run (one per day of flights) and publishes their daily rollup per carrier.

Append days with ``airflow_finalckpt.examples.nycflights13.incremental.append_days`` between
runs. Environment knobs (optional):
  FINALCKPT_EXAMPLE_FEED_WAREHOUSE  the Iceberg warehouse (default $AIRFLOW_HOME/finalckpt/feed)
  FINALCKPT_EXAMPLE_FEED_OUTPUT     the rollup table (default $AIRFLOW_HOME/finalckpt/incremental)
"""

from __future__ import annotations

from airflow_finalckpt.examples.nycflights13.incremental import (
    build_incremental_dag,
    env_incremental_settings,
)

dag = build_incremental_dag("nycflights13_incremental", **env_incremental_settings())
