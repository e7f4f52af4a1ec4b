"""Copies of the branching example pipeline for the topology tier (tests/e2e/test_topology.py),
run by two Celery workers that share no disk but the DAG folder and the ``finalckpt-data``
volume (``$FINALCKPT_TOPOLOGY_DATA``, a ReadWriteMany PVC in a Helm deployment): each copy's
input, checkpoints and Parquet tables live there, its SQL table in its own PostgreSQL database
(``$FINALCKPT_TOPOLOGY_SINK_URL`` with ``{dag}`` replaced by the DAG id).

A gate file ``$FINALCKPT_TOPOLOGY_CONTROL/<dag_id>/<stage>-t<try>-<n>`` holds the n-th batch of
``<stage>``'s try ``<try>`` while it exists; on entering the hold the batch writes
``<gate>.held``, which the test waits for. The control directory is test control only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from airflow_finalckpt.examples.nycflights13.branching import build_branching_dag

DATA = Path(os.environ.get("FINALCKPT_TOPOLOGY_DATA", "/tmp/finalckpt-topology-data"))
CONTROL = Path(os.environ.get("FINALCKPT_TOPOLOGY_CONTROL", "/tmp/finalckpt-topology-control"))
SINK_URL = os.environ.get("FINALCKPT_TOPOLOGY_SINK_URL")
DAYS = int(os.environ.get("FINALCKPT_TOPOLOGY_DAYS", "14"))
#: ingest writes two parts (7 days each): enrich, delay_windows and carrier_daily have two
#: splits and take one per batch.
BATCH_SIZES = {
    "ingest": 7,
    "weather": 3,
    "enrich": 1,
    "delay_windows": 1,
    "carrier_daily": 1,
    "publish": 4,
}
HOLD_S = 600.0
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.showConsoleProgress": "false"}
PACED = ("ingest", "weather", "enrich", "delay_windows", "carrier_daily", "publish")
_batches: dict[tuple[str, str, int], int] = {}


def _pace(dag_id: str, stage: str) -> Callable[[object], None]:
    def pace(_ctx: object) -> None:
        from airflow.sdk import get_current_context

        attempt = int(get_current_context()["ti"].try_number)
        key = (dag_id, stage, attempt)
        n = _batches[key] = _batches.get(key, 0) + 1
        gate = CONTROL / dag_id / f"{stage}-t{attempt}-{n}"
        if gate.exists():
            gate.with_name(f"{gate.name}.held").touch()
            deadline = time.monotonic() + HOLD_S
            while gate.exists() and time.monotonic() < deadline:
                time.sleep(0.3)

    return pace


def _copy(dag_id: str) -> object:
    return build_branching_dag(
        dag_id,
        input_dir=str(DATA / "input"),
        output_dir=str(DATA / dag_id / "output"),
        sql_url=SINK_URL.replace("{dag}", dag_id) if SINK_URL else None,
        days=DAYS,
        retries=1,
        batch_sizes=BATCH_SIZES,
        spark_conf=SPARK_CONF,
        batch_hooks={stage: _pace(dag_id, stage) for stage in PACED},
        windows_asset=f"{dag_id}_delay_windows",
        carrier_asset=f"{dag_id}_carrier_daily",
    )


# end to end, nothing held: both workers take stages of the one run
plain_dag = _copy("topology_plain")
# a Celery worker's whole process tree SIGKILLed while delay_windows runs on it
sigkill_dag = _copy("topology_worker_sigkill")
# the broker restarted while tasks are queued
redis_dag = _copy("topology_redis_restart")
# a worker's warm shutdown while one of its stages is deferred
warm_dag = _copy("topology_warm_shutdown")
# the triggerer killed while stages wait for their final checkpoint
triggerer_dag = _copy("topology_triggerer")
# stop with savepoint (resume on the other worker) and stop with drain
savepoint_dag = _copy("topology_savepoint")
drain_dag = _copy("topology_drain")
