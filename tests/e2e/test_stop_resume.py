"""Stop with savepoint / resume and stop with drain on a REAL Airflow (api-server, scheduler,
dag-processor, triggerer, LocalExecutor, PostgreSQL), driven by the installed ``finalckpt`` CLI.

- savepoint mid-``enrich``: the stage stops at its next batch boundary, the savepoint completes,
  the task releases Spark and waits deferred (no worker slot), nothing downstream starts; after
  ``finalckpt resume`` the same DAG run goes on, enrich processes only the splits it had not
  finished, and the final sinks equal the uninterrupted result row for row; a SIGKILL of the
  triggerer while enrich waits in it for the resume changes nothing (the new triggerer takes
  the trigger over, the same try goes on);
- drain mid-``ingest``: ingest stops taking days, every window of the days it read fires, the
  DAG run succeeds with a note saying how much was left unread, nothing from unread days
  appears, and the drained savepoint can be neither resumed nor restored.

The stages are paced by order, not by timing (tests/e2e/stop_dags/stop_pipelines.py): enrich's
second batch waits until the stop request is stored, ingest's second batch until the test
writes the drain gate. The stop latency (request -> savepoint complete -> task deferred) is
printed for the notes; benchmarks/stop_latency.py measures it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.control import PipelineControl
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import CheckpointKind, StageLifecycle, StopMode, StopState
from airflow_finalckpt.examples.nycflights13.data import day_of_split, first_days
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine

from .airflow_cluster import AirflowCluster
from .ui_cluster import DAYS, DRAIN_DAG, RESUME_DAG, ui_cluster
from .ui_cluster import _environment as ui_environment
from .ui_cluster import store_url as ui_store_url

SAVEPOINT_DAG = RESUME_DAG  # this module's own copy of the pipeline (its own sinks)
#: Suspended means suspended: what is checked not to move is watched at least this long.
QUIET_S = 4.0


@pytest.fixture
def cluster(airflow_cluster: Callable[..., AirflowCluster]) -> AirflowCluster:
    return ui_cluster(airflow_cluster)


@pytest.fixture
def work(cluster: AirflowCluster) -> Path:
    return ui_environment()[1]


@pytest.fixture
def store_url(cluster: AirflowCluster) -> str:
    return ui_store_url()


@pytest.fixture
def control(store_url: str, work: Path) -> Iterator[PipelineControl]:
    engine = make_engine(store_url)
    yield PipelineControl(engine, CheckpointStorage(str(work / "checkpoints")))
    engine.dispose()


def finalckpt(work: Path, store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as an operator would run it (an admin on the store:
    ``--direct-store``; test_stop_api.py runs it through the api-server)."""
    direct = ["--direct-store"] if args[0] in ("stop", "resume", "reset", "status") else []
    return subprocess.run(
        [str(Path(sys.executable).parent / "finalckpt"), *args, *direct],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={
            **os.environ,
            "AIRFLOW__FINALCKPT__STORE_URL": store_url,
            "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "checkpoints"),
        },
    )


def wait_for(check: Callable[[], Any], what: str, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # e.g. the pipeline is not registered yet
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def sinks(output: Path) -> tuple[ParquetTableSink, SqlTableSink]:
    return (
        ParquetTableSink("delay_windows_parquet", f"{output}/delay_windows"),
        SqlTableSink("delay_windows_sql", f"sqlite:///{output}/delay_windows.db", "delay_windows"),
    )


def test_stop_with_savepoint_mid_enrich_then_resume(
    cluster: AirflowCluster, control: PipelineControl, work: Path, store_url: str
) -> None:
    run_id = cluster.trigger_dag(SAVEPOINT_DAG)
    key = wait_for(lambda: control.resolve(SAVEPOINT_DAG, run_id), "the pipeline to register")
    coord = Coordinator(control.engine, key)
    cluster.wait_for_task(SAVEPOINT_DAG, run_id, "enrich", states=("running",), timeout=300)
    # enrich's second batch waits for the stop request: the stop lands mid-stage
    wait_for(lambda: coord.stage("enrich").progress.finished_splits, "enrich's first batch")

    stopped = finalckpt(work, store_url, "stop", SAVEPOINT_DAG, run_id, "--savepoint", "--wait")
    assert stopped.returncode == 0, stopped.stderr
    assert "COMPLETED, savepoint" in stopped.stdout, stopped.stdout
    stop = coord.stop_request()
    assert stop is not None and stop.state is StopState.COMPLETED
    savepoint = coord.checkpoint(stop.savepoint_id or 0)
    assert savepoint.kind is CheckpointKind.SAVEPOINT
    cluster.wait_for_task(SAVEPOINT_DAG, run_id, "enrich", states=("deferred",), timeout=60)
    deferred_at = time.time()
    latency = {
        "savepoint_complete_s": round((savepoint.completed_at or 0) - stop.requested_at, 2),
        "task_deferred_spark_released_s_at_most": round(deferred_at - stop.requested_at, 2),
    }
    print(f"\n[stop latency] savepoint mid-enrich: {json.dumps(latency)}", file=sys.stderr)

    views = coord.stages()
    assert views["ingest"].lifecycle is StageLifecycle.CLOSED
    assert views["enrich"].lifecycle is StageLifecycle.SUSPENDED
    done_at_stop = set(views["enrich"].progress.finished_splits)
    manifest = cluster.xcom(SAVEPOINT_DAG, run_id, "ingest", key="end_of_data")["manifest"]
    assert 1 <= len(done_at_stop) < len(manifest) == 3
    assert views["delay_windows"].lifecycle is StageLifecycle.NOT_STARTED
    record = control.storage.read_checkpoint(savepoint.metadata_path or "")
    assert record.stages["enrich"].status.value == "PARTIALLY_FINISHED"
    assert record.stages["ingest"].status.value == "FULLY_FINISHED"

    status = finalckpt(work, store_url, "status", SAVEPOINT_DAG, run_id)
    assert status.returncode == 0 and "suspended" in status.stdout

    # the triggerer crashes (SIGKILL) while enrich waits in it for the resume: a new triggerer
    # takes the trigger over and the same try of enrich goes on (no failure, no retry)
    try_at_stop = cluster.task_instance(SAVEPOINT_DAG, run_id, "enrich")["try_number"]
    cluster.restart("triggerer")
    assert cluster.task_instance(SAVEPOINT_DAG, run_id, "enrich")["state"] == "deferred"
    # suspended means suspended: nothing moved since the deferral (at least QUIET_S ago, the
    # status command and the restart took part of it), the run stays running
    time.sleep(max(0.0, QUIET_S - (time.time() - deferred_at)))
    assert set(coord.stage("enrich").progress.finished_splits) == done_at_stop
    assert cluster.dag_run(SAVEPOINT_DAG, run_id)["state"] == "running"
    assert cluster.task_instance(SAVEPOINT_DAG, run_id, "enrich")["state"] == "deferred"

    resumed = finalckpt(work, store_url, "resume", SAVEPOINT_DAG, run_id)
    assert resumed.returncode == 0, resumed.stderr
    state = cluster.wait_for_run(SAVEPOINT_DAG, run_id, timeout=600)
    assert state == "success", cluster.log_tails(80)
    assert cluster.task_instance(SAVEPOINT_DAG, run_id, "enrich")["try_number"] == try_at_stop

    stage_run = cluster.xcom(SAVEPOINT_DAG, run_id, "enrich", key="stage_run")
    assert set(stage_run["processed_splits"]) == set(manifest) - done_at_stop
    assert coord.stop_request().state is StopState.RESUMED  # type: ignore[union-attr]
    assert all(v.lifecycle is StageLifecycle.CLOSED for v in coord.stages().values())
    expected = reference_pipeline(first_days(DAYS)).windows
    parquet, sql = sinks(work / "resume" / "output")
    assert_windows_match(parquet.read_pandas(), expected)
    assert_windows_match(sql.read_pandas(), expected)
    assert not [t for t, s in coord.transactions() if s == "PRECOMMITTED"]


def test_stop_with_drain_mid_ingest(
    cluster: AirflowCluster, control: PipelineControl, work: Path, store_url: str
) -> None:
    gate = work / "drain" / "stop-sent"  # ingest's second batch waits for it (stop_pipelines.py)
    gate.unlink(missing_ok=True)
    run_id = cluster.trigger_dag(DRAIN_DAG)
    key = wait_for(lambda: control.resolve(DRAIN_DAG, run_id), "the pipeline to register")
    coord = Coordinator(control.engine, key)
    wait_for(lambda: coord.stage("ingest").progress.finished_splits, "ingest's first batch")

    drained = finalckpt(work, store_url, "stop", DRAIN_DAG, run_id, "--drain")
    assert drained.returncode == 0, drained.stderr
    # ingest still holds its second batch: the drain cannot have completed yet
    again = finalckpt(work, store_url, "stop", DRAIN_DAG, run_id, "--savepoint")
    assert again.returncode == 2 and "already stopping" in again.stderr
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.touch()

    state = cluster.wait_for_run(DRAIN_DAG, run_id, timeout=600)
    assert state == "success", cluster.log_tails(80)

    stop = coord.stop_request()
    assert stop is not None and stop.mode is StopMode.DRAIN and stop.state is StopState.COMPLETED
    final = coord.checkpoint(stop.savepoint_id or 0)
    assert final.kind is CheckpointKind.DRAINED_SAVEPOINT and final.metadata_path
    print(
        f"\n[stop latency] drain mid-ingest: drained savepoint complete "
        f"{(final.completed_at or 0) - stop.requested_at:.1f}s after the request "
        "(the whole downstream pipeline ran in between)",
        file=sys.stderr,
    )
    ingest = cluster.xcom(DRAIN_DAG, run_id, "ingest", key="end_of_data")
    read = sorted(day_of_split(s) for s in coord.stage("ingest").progress.finished_splits)
    assert ingest["drain"] is True
    assert 7 <= len(read) < DAYS and ingest["unread_splits"] == DAYS - len(read)
    assert read == first_days(len(read))  # batches are taken in event-time order
    for task in ("enrich", "delay_windows", "publish"):
        assert cluster.xcom(DRAIN_DAG, run_id, task, key="end_of_data")["drain"] is True

    # every window of the days read fired; nothing from the unread days is there
    expected = reference_pipeline(read).windows
    parquet, sql = sinks(work / "drain" / "output")
    assert_windows_match(parquet.read_pandas(), expected)
    assert_windows_match(sql.read_pandas(), expected)
    assert len(expected) < len(reference_pipeline(first_days(DAYS)).windows)

    note = cluster.dag_run(DRAIN_DAG, run_id).get("note") or ""
    assert "Drained" in note and f"{DAYS - len(read)} input splits were left unread" in note

    resume = finalckpt(work, store_url, "resume", DRAIN_DAG, run_id)
    assert resume.returncode == 2 and "cannot be resumed" in resume.stderr
    restore = finalckpt(
        work, store_url, "restore", DRAIN_DAG, "--from", final.metadata_path, "--dry-run"
    )
    assert restore.returncode == 2 and "drained savepoint" in restore.stderr
