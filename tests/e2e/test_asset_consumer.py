"""Asset events mark commits, exactly once, on a REAL Airflow (api-server, scheduler,
dag-processor, triggerer, LocalExecutor, PostgreSQL; coordination store on PostgreSQL): an
Asset-scheduled consumer DAG runs once per commit of a finalckpt stage, never on a re-published
``end_of_data`` (issue 14 item 3).

tests/e2e/asset_dags/asset_pipeline.py: the producer's single stage commits three rows to a
Parquet table at its final checkpoint; the consumer is ``schedule=[Asset(...)]``.

1. producer run 1, pipeline A: the stage commits -> one Asset event (pipeline A, the checkpoint
   it closed on, 3 rows) -> one consumer run, which received exactly that event;
2. producer run 2 continues pipeline A: the stage is CLOSED, its ``end_of_data`` is re-published
   and the task succeeds, but nothing new was committed -> no Asset event, and no consumer run
   in the scheduler loops that follow;
3. producer run 3, pipeline B (a new commit to the same table) -> exactly one more event and one
   more consumer run (so the consumer did not just stop running).

The cluster sends its metrics to a StatsD listener of this test (``[metrics] statsd_on``): the
checkpoint metrics of the workers' (and triggerer's) coordinators arrive over UDP.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_finalckpt.sinks import ParquetTableSink

from .airflow_cluster import AirflowCluster

pytestmark = pytest.mark.postgres

DAGS = Path(__file__).resolve().parent / "asset_dags"
PRODUCER = "finalckpt_e2e_asset_producer"
CONSUMER = "finalckpt_e2e_asset_consumer"
#: Scheduler loops (heartbeat 2 s in the harness) that must pass without a consumer run after
#: the continuation run succeeded.
QUIET_S = 12.0


class StatsdListener:
    """A UDP socket on 127.0.0.1 that keeps every StatsD line it receives."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                self.lines.extend(self.sock.recv(65535).decode().splitlines())
            except TimeoutError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def names(self) -> set[str]:
        return {line.split(":", 1)[0].split(",", 1)[0] for line in self.lines}


def _wait(predicate: Callable[[], Any], what: str, cluster: AirflowCluster, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{cluster.log_tails(40)}"
        time.sleep(0.5)


def consumer_runs(cluster: AirflowCluster) -> list[dict[str, Any]]:
    runs = cluster.api(
        "GET", f"/api/v2/dags/{quote(CONSUMER, safe='')}/dagRuns", params={"limit": 100}
    )["dag_runs"]
    return sorted(runs, key=lambda r: r["run_after"])


def asset_events(cluster: AirflowCluster) -> list[dict[str, Any]]:
    return cluster.api(
        "GET",
        "/api/v2/assets/events",
        params={"source_dag_id": PRODUCER, "limit": 100, "order_by": "timestamp"},
    )["asset_events"]


def consumed(work: Path, run_id: str) -> list[dict[str, Any]]:
    return json.loads((work / "consumed" / f"{run_id}.json").read_text())


def test_consumer_runs_once_per_commit_never_on_a_republish(
    airflow_cluster: Callable[..., AirflowCluster], pg_store_url: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    work = tmp_path
    statsd = StatsdListener()
    try:
        cluster = airflow_cluster(
            [DAGS],
            extra_env={
                "AIRFLOW__FINALCKPT__STORE_URL": pg_store_url,
                "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "checkpoints"),
                "FINALCKPT_E2E_WORK": str(work),
                "AIRFLOW__METRICS__STATSD_ON": "True",
                "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
                "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
            },
            expect_dags=[PRODUCER, CONSUMER],
        )
        _run_producer_and_consumer(cluster, work, started)
    finally:
        statsd.close()
    # the stage metrics and the coordinators' checkpoint metrics, from the cluster's processes
    expected = {
        "airflow.finalckpt.batch.duration",
        "airflow.finalckpt.stage.closed",
        "airflow.finalckpt.sink.commit.duration",
        "airflow.finalckpt.checkpoint.duration",
        "airflow.finalckpt.checkpoint.size",
        "airflow.finalckpt.checkpoint.state_size",
    }
    assert expected <= statsd.names(), sorted(n for n in statsd.names() if "finalckpt" in n)


def _run_producer_and_consumer(cluster: AirflowCluster, work: Path, started: float) -> None:
    up = time.monotonic()
    cluster.unpause(CONSUMER)
    first_key, second_key = (f"assets-{uuid.uuid4().hex[:8]}" for _ in range(2))

    # 1. a commit: one event, one consumer run that received it
    run1 = cluster.trigger_dag(PRODUCER, conf={"pipeline_key": first_key})
    assert cluster.wait_for_run(PRODUCER, run1, timeout=300) == "success", cluster.log_tails(60)
    (event1,) = asset_events(cluster)
    assert event1["source_run_id"] == run1
    assert event1["extra"]["pipeline_key"] == first_key
    assert event1["extra"]["stage_id"] == "publish"
    assert isinstance(event1["extra"]["checkpoint_id"], int)
    assert event1["extra"]["rows"] == 3 and event1["extra"]["rows_by_sink"] == {"keys": 3}
    (consumer1,) = _wait(
        lambda: consumer_runs(cluster) or None, "the consumer's run for commit 1", cluster, 120
    )
    assert consumer1["run_type"] == "asset_triggered", consumer1
    state = cluster.wait_for_run(CONSUMER, consumer1["dag_run_id"], timeout=120)
    assert state == "success", cluster.log_tails(60)
    assert consumed(work, consumer1["dag_run_id"]) == [
        {"extra": event1["extra"], "source_run_id": run1}
    ]

    # 2. a continuation with nothing new: the CLOSED stage re-publishes, no event, no consumer run
    run2 = cluster.trigger_dag(PRODUCER, conf={"pipeline_key": first_key})
    assert cluster.wait_for_run(PRODUCER, run2, timeout=300) == "success", cluster.log_tails(60)
    log2 = cluster.logs(PRODUCER, run2, "publish", 1)
    assert "end_of_data re-published, no Asset event" in log2
    time.sleep(QUIET_S)
    assert [e["source_run_id"] for e in asset_events(cluster)] == [run1]
    assert [r["dag_run_id"] for r in consumer_runs(cluster)] == [consumer1["dag_run_id"]]

    # 3. a new commit (another pipeline, same table): exactly one more event and consumer run
    run3 = cluster.trigger_dag(PRODUCER, conf={"pipeline_key": second_key})
    assert cluster.wait_for_run(PRODUCER, run3, timeout=300) == "success", cluster.log_tails(60)
    consumers = _wait(
        lambda: (runs := consumer_runs(cluster)) and len(runs) >= 2 and runs,
        "the consumer's run for commit 2",
        cluster,
        120,
    )
    consumer2 = consumers[-1]
    state = cluster.wait_for_run(CONSUMER, consumer2["dag_run_id"], timeout=120)
    assert state == "success", cluster.log_tails(60)
    time.sleep(4)  # a scheduler loop or two: nothing else may follow
    events = asset_events(cluster)
    assert [e["source_run_id"] for e in events] == [run1, run3]
    assert events[1]["extra"]["pipeline_key"] == second_key
    assert [r["dag_run_id"] for r in consumer_runs(cluster)] == [
        consumer1["dag_run_id"],
        consumer2["dag_run_id"],
    ]
    assert consumed(work, consumer2["dag_run_id"]) == [
        {"extra": events[1]["extra"], "source_run_id": run3}
    ]
    # the table holds both commits, each once
    table = ParquetTableSink("keys", str(work / "keys")).read_pandas()
    assert sorted(table["k"]) == ["a", "a", "bb", "bb", "ccc", "ccc"]
    print(
        f"\n[airflow-e2e] assets: cluster up in {up - started:.1f}s, three producer runs and "
        f"two consumer runs in {time.monotonic() - up:.1f}s"
    )
