"""The branching example pipeline on a REAL Airflow (api-server, scheduler, dag-processor,
triggerer, LocalExecutor with parallelism 4, PostgreSQL), the coordination store and the SQL sink
on PostgreSQL: the FLIP-147 situation end to end.

``[ingest, weather] >> enrich >> delay_windows >> publish`` and ``enrich >> carrier_daily``
(tests/e2e/branching_dags/branching_pipeline.py, paced by gates so the overlap does not depend on
the load). Observed, not assumed:

- ``carrier_daily`` finished while its sibling ``delay_windows`` ran: the task instance was
  DEFERRED on ``FinalCheckpointTrigger`` (its trigger's classpath, read from the API) in the
  same listing that shows ``delay_windows`` RUNNING; it resumed in the same try on the
  trigger's ``closable`` event (trigger log) and closed on a checkpoint the retried sibling
  acknowledged;
- ``delay_windows`` (task + Spark JVM) is SIGKILLed mid-stage while ``carrier_daily`` waits
  deferred; Airflow retries it and the retry processes only the splits the killed attempt had
  not finished;
- the checkpoints' ``_metadata`` hold FULLY_FINISHED, PARTIALLY_FINISHED and NOT_STARTED
  stages side by side;
- every transaction is committed, and all three sinks equal an independent pandas computation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.examples.nycflights13.data import first_days
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_carrier_daily_match,
    assert_windows_match,
    reference_carrier_daily,
    reference_pipeline,
)
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

DAGS = Path(__file__).resolve().parent / "branching_dags"
DAG_ID = "nycflights13_branching_e2e"
DAYS = 21  # three ingest parts: enrich, delay_windows and carrier_daily have three splits
TRIGGER = "airflow_finalckpt.triggers.final_checkpoint.FinalCheckpointTrigger"


def _wait(predicate: Callable[[], Any], what: str, timeout: float, cluster: Any) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{cluster.log_tails(40)}"
        time.sleep(0.3)


def _finished(coord: Coordinator, stage_id: str) -> frozenset[str]:
    try:
        return coord.stage(stage_id).progress.finished_splits
    except Exception:  # pipeline or stage not registered yet
        return frozenset()


def test_branches_defer_on_final_checkpoint_and_survive_sigkill(
    airflow_cluster: Callable[..., Any], pg_store_url: str, tmp_path: Path
) -> None:
    work = tmp_path
    gates = work / "gates"
    gates.mkdir()
    (gates / "carrier_daily").touch()
    (gates / "delay_windows").touch()
    (gates / "delay_windows_retry").touch()
    cluster = airflow_cluster(
        [DAGS],
        extra_env={
            "AIRFLOW__FINALCKPT__STORE_URL": pg_store_url,
            "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "checkpoints"),
            # keep every checkpoint's _metadata for the assertions below
            "AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS": "100",
            # the retry (not the lease) answers the checkpoint here: a killed attempt's lease
            # must outlast the retry's start even under load (docs/protocol.md)
            "AIRFLOW__FINALCKPT__ATTEMPT_LEASE_S": "900",
            "FINALCKPT_E2E_WORK": str(work),
            "FINALCKPT_E2E_DAYS": str(DAYS),
            "FINALCKPT_EXAMPLE_SQL_URL": pg_store_url,
        },
        expect_dags=[DAG_ID],
    )
    assert cluster.parallelism >= 2
    key = f"e2e-branching-{uuid.uuid4().hex[:8]}"
    run_id = cluster.trigger_dag(DAG_ID, conf={"pipeline_key": key})
    coord = Coordinator(make_engine(pg_store_url), key)

    # delay_windows records its first batch, then holds its second (first try)
    _wait(lambda: _finished(coord, "delay_windows"), "delay_windows' first batch", 900, cluster)
    # let carrier_daily go: it finishes while delay_windows runs, and defers
    (gates / "carrier_daily").unlink()

    def overlap() -> dict[str, dict[str, Any]] | None:
        tis = {ti["task_id"]: ti for ti in cluster.task_instances(DAG_ID, run_id)}
        if tis["carrier_daily"]["state"] == "deferred" and tis["delay_windows"]["state"] == (
            "running"
        ):
            return tis
        return None

    seen = _wait(overlap, "carrier_daily deferred while delay_windows runs", 420, cluster)
    assert seen["carrier_daily"]["trigger"]["classpath"] == TRIGGER, seen["carrier_daily"]
    assert seen["delay_windows"]["try_number"] == 1
    carrier_try = seen["carrier_daily"]["try_number"]
    carrier = coord.stage("carrier_daily")
    assert carrier.lifecycle.value == "FINISHED"  # finished, not closed: its output uncommitted
    assert not [s for t, s in coord.transactions("carrier_daily") if s == "COMMITTED"]

    # SIGKILL delay_windows (task + Spark JVM) mid-stage while carrier_daily waits deferred
    done_at_kill = set(coord.stage("delay_windows").progress.finished_splits)
    epoch_at_kill = coord.stage("delay_windows").epoch
    killed = cluster.kill_task_process(DAG_ID, run_id, "delay_windows", tree=True, try_number=1)
    assert killed is not None and killed.try_number == 1
    still = cluster.task_instance(DAG_ID, run_id, "carrier_daily")
    assert (still["state"], still["try_number"]) == ("deferred", carrier_try), still

    # the retry's first batch acknowledges carrier_daily's final checkpoint: carrier_daily
    # closes while the retry holds its second batch
    _wait(
        lambda: coord.stage("carrier_daily").lifecycle.value == "CLOSED",
        "carrier_daily closed",
        420,
        cluster,
    )
    closed_on = coord.stage("carrier_daily").closed_checkpoint_id
    # _metadata: finished, partially finished and not started stages in one checkpoint (read
    # now: later checkpoints make retention discard it)
    storage = CheckpointStorage(str(work / "checkpoints"))
    records = {cid: storage.read_checkpoint(path) for cid, path in storage.list_checkpoints(key)}
    assert closed_on in records, sorted(records)
    (gates / "delay_windows_retry").unlink()

    state = cluster.wait_for_run(DAG_ID, run_id, timeout=600)
    assert state == "success", cluster.log_tails(60)

    # the retry of delay_windows redid only the splits the killed attempt had not finished
    tis = {ti["task_id"]: ti for ti in cluster.task_instances(DAG_ID, run_id)}
    assert tis["delay_windows"]["try_number"] == 2
    manifest = cluster.xcom(DAG_ID, run_id, "enrich", key="end_of_data")["manifest"]
    stage_run = cluster.xcom(DAG_ID, run_id, "delay_windows", key="stage_run")
    assert len(manifest) == 3 and 1 <= len(done_at_kill) < 3
    assert stage_run["epoch"] == epoch_at_kill + 1
    assert set(stage_run["processed_splits"]) == set(manifest) - done_at_kill

    # carrier_daily resumed in the same try on the trigger's event, and closed on a checkpoint
    # the retried delay_windows acknowledged
    assert tis["carrier_daily"]["try_number"] == carrier_try
    views = coord.stages()
    assert all(v.lifecycle.value == "CLOSED" for v in views.values()), views
    assert views["carrier_daily"].closed_checkpoint_id == closed_on
    threshold = views["carrier_daily"].finish_threshold
    assert closed_on is not None and threshold is not None and closed_on >= threshold
    task_logs = cluster.logs_dir / f"dag_id={DAG_ID}" / f"run_id={run_id}" / "task_id=carrier_daily"
    trigger_logs = "".join(
        p.read_text(errors="replace")
        for p in task_logs.glob(f"attempt={carrier_try}.log.trigger.*.log")
    )
    assert "Trigger fired event" in trigger_logs, trigger_logs[-3000:]
    assert f"'checkpoint_id': {closed_on}" in trigger_logs and "closable" in trigger_logs

    closing = records[closed_on]
    statuses = {sid: s.status.value for sid, s in closing.stages.items()}
    assert statuses["carrier_daily"] == "FULLY_FINISHED", statuses
    assert statuses["delay_windows"] == "PARTIALLY_FINISHED", statuses
    assert statuses["publish"] == "NOT_STARTED", statuses
    assert statuses["enrich"] == "FULLY_FINISHED", statuses
    acked = set(closing.stages["delay_windows"].finished_splits)
    assert done_at_kill < acked < set(manifest)  # acknowledged by the retry, mid-stage
    mixed = [
        cid
        for cid, record in records.items()
        if {s.status.value for s in record.stages.values()}
        >= {"FULLY_FINISHED", "PARTIALLY_FINISHED", "NOT_STARTED"}
    ]
    assert closed_on in mixed

    # exactly once: every transaction committed, every sink equals the reference
    txns = coord.transactions()
    assert txns and {s for _t, s in txns} == {"COMMITTED"}
    days = first_days(DAYS)
    windows = reference_pipeline(days).windows
    assert_windows_match(
        ParquetTableSink("delay_windows_parquet", f"{work}/output/delay_windows").read_pandas(),
        windows,
    )
    assert_windows_match(
        SqlTableSink("delay_windows_sql", pg_store_url, "delay_windows").read_pandas(), windows
    )
    assert_carrier_daily_match(
        ParquetTableSink("carrier_daily_parquet", f"{work}/output/carrier_daily").read_pandas(),
        reference_carrier_daily(days),
    )
