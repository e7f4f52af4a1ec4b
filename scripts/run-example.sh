#!/usr/bin/env bash
# Set up everything and run the branching example pipeline (nycflights13, 6 stages) end to end with
# Airflow's dag.test() on embedded defaults: SQLite, local filesystem, Spark local[*].
# Options go to `python -m airflow_finalckpt.examples.nycflights13.run` (try --help):
#   --days N              days of 2013 to process (default: all 365)
#   --crash-mid-enrich    fail the first DAG run inside enrich, then resume in a new DAG run
#   --no-lakehouse        leave out the Iceberg and Delta Lake sinks (on by default)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m airflow_finalckpt.examples.nycflights13.run "$@"
