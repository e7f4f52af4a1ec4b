"""The example pipeline on a REAL Airflow (api-server, scheduler, dag-processor, triggerer,
LocalExecutor, PostgreSQL) with the coordination store and the SQL sink on PostgreSQL.

The enrich task process (and its Spark JVM) is SIGKILLed mid-stage; Airflow retries it; the
retry processes only the splits the killed attempt had not finished (from the run's stage_run
XCom record and the coordination store), the waiting for final checkpoints is deferred to the
real triggerer, and both sinks equal an independent pandas computation row for row.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_finalckpt.core.coordinator import Coordinator
from airflow_finalckpt.examples.nycflights13.data import first_days
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.store.engine import make_engine

REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"
DAG_ID = "nycflights13_pipeline"
DAYS = 21  # three ingest parts: enrich runs three batches


def test_sigkill_mid_enrich_then_retry_commits_exactly_once(
    airflow_cluster: Callable[..., Any], pg_url: str, tmp_path: Path
) -> None:
    work = tmp_path
    cluster = airflow_cluster(
        [REPO_DAGS],
        extra_env={
            "AIRFLOW__FINALCKPT__STORE_URL": pg_url,
            "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "checkpoints"),
            "FINALCKPT_EXAMPLE_INPUT": str(work / "input"),
            "FINALCKPT_EXAMPLE_OUTPUT": str(work / "output"),
            "FINALCKPT_EXAMPLE_SQL_URL": pg_url,
            "FINALCKPT_EXAMPLE_DAYS": str(DAYS),
            "FINALCKPT_EXAMPLE_BATCH_DELAY_S": "4",
        },
        expect_dags=[DAG_ID],
    )
    key = f"e2e-{uuid.uuid4().hex[:8]}"
    run_id = cluster.trigger_dag(DAG_ID, conf={"pipeline_key": key})
    coord = Coordinator(make_engine(pg_url), key)

    # wait until enrich has durably finished its first batch, then kill it mid-stage
    cluster.wait_for_task(DAG_ID, run_id, "enrich", states=("running",), timeout=300)
    deadline = time.monotonic() + 180
    while True:
        try:
            done = coord.stage("enrich").progress.finished_splits
        except Exception:  # pipeline not registered yet
            done = frozenset()
        if done:
            break
        assert time.monotonic() < deadline, "enrich never finished a batch"
        time.sleep(0.2)
    killed = cluster.kill_task_process(DAG_ID, run_id, "enrich", tree=True)
    assert killed is not None
    done_at_kill = set(coord.stage("enrich").progress.finished_splits)
    epoch_at_kill = coord.stage("enrich").epoch

    state = cluster.wait_for_run(DAG_ID, run_id, timeout=600)
    assert state == "success", cluster.log_tails(60)

    tries = {ti["task_id"]: ti["try_number"] for ti in cluster.task_instances(DAG_ID, run_id)}
    assert tries["enrich"] == 2 and tries["ingest"] == 1
    stage_run = cluster.xcom(DAG_ID, run_id, "enrich", key="stage_run")
    manifest = cluster.xcom(DAG_ID, run_id, "ingest", key="end_of_data")["manifest"]
    assert len(manifest) == 3 and 1 <= len(done_at_kill) < 3
    assert stage_run["epoch"] == epoch_at_kill + 1
    assert set(stage_run["processed_splits"]) == set(manifest) - done_at_kill

    views = coord.stages()
    assert all(v.lifecycle.value == "CLOSED" for v in views.values())
    # every stage waited for its final checkpoint in the real triggerer or closed at once
    assert all(v.closed_checkpoint_id >= v.finish_threshold for v in views.values())

    expected = reference_pipeline(first_days(DAYS)).windows
    parquet = ParquetTableSink("delay_windows_parquet", f"{work}/output/delay_windows")
    sql = SqlTableSink("delay_windows_sql", pg_url, "delay_windows")
    assert_windows_match(parquet.read_pandas(), expected)
    assert_windows_match(sql.read_pandas(), expected)
    committed = [t for t, s in coord.transactions() if s == "COMMITTED"]
    assert committed and not [t for t, s in coord.transactions() if s == "PRECOMMITTED"]
