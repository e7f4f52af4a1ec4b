"""Checkpoint metrics over a real StatsD socket: a real ``dag.test()`` of a two-stage DAG with
``[metrics] statsd_on`` pointed at a UDP listener of this test. Airflow's own StatsD client sends
what the coordinator reports (``core.observe`` -> ``metrics.install``): every completed
checkpoint's duration, ``_metadata`` size and state size, every acknowledgement's lag, the last
acknowledgement's lag; the values agree with the coordination store and the files on disk.

Run in a child process with its own ``[metrics]`` configuration. ``dag.test()`` runs tasks and
triggers in-process, without the task runner's start-up that configures Airflow's stats (like
the triggerer's trigger-runner process): ``metrics`` configures them from ``[metrics]`` itself."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

TWO_STAGE_DAG = """
import time
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink


def rows(ctx):
    time.sleep(0.4)  # longer than the checkpoint interval: periodic checkpoints in between
    return ctx.spark.createDataFrame([(s, len(s)) for s in ctx.splits], "k string, n long")


def report(ctx):
    return ctx.read_parts().groupBy("n").count()


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    source = FinalCheckpointStageOperator(
        task_id="source",
        transform=rows,
        splits=["a", "bb", "ccc", "dddd"],
        batch_size=1,
        retries=0,
    )
    summary = FinalCheckpointStageOperator(
        task_id="summary",
        transform=report,
        sinks=[ParquetTableSink("counts", OUT_DIR + "/counts")],
        retries=0,
    )
    source >> summary
"""

RUN_DAG = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("metrics_dag", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
run = module.dag.test(run_conf={"pipeline_key": sys.argv[2]})
open(sys.argv[3], "w").write(str(run.state))
"""

#: ``airflow.finalckpt.checkpoint.ack_lag,stage_id=source:12.5|ms`` (InfluxDB-style tags)
PACKET = re.compile(
    r"^airflow\.(?P<name>[\w.]+)(?P<tags>(?:,\w+=[^,:]+)*):(?P<value>[-\d.]+)\|(?P<kind>\w+)"
)


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
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            self.lines.extend(data.decode().splitlines())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def metrics(self, name: str) -> list[tuple[dict[str, str], float, str]]:
        found = []
        for line in self.lines:
            match = PACKET.match(line)
            if match and match["name"] == name:
                tags = dict(tag.split("=", 1) for tag in match["tags"].split(",") if tag)
                found.append((tags, float(match["value"]), match["kind"]))
        return found


def test_checkpoint_metrics_reach_statsd(airflow_home: Any, tmp_path: Path) -> None:
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.store.engine import make_engine

    suffix = uuid.uuid4().hex[:8]
    dag_id, key = f"metrics_{suffix}", f"metrics.{suffix}"
    dag_file = airflow_home.dags_folder / f"test_dag_metrics_{suffix}.py"
    dag_file.write_text(
        f"DAG_ID = {dag_id!r}\nOUT_DIR = {str(tmp_path / 'out')!r}\n" + TWO_STAGE_DAG
    )
    store_url = f"sqlite:///{tmp_path}/coordination.db"
    listener = StatsdListener()
    env = {
        **os.environ,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(listener.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
        "AIRFLOW__FINALCKPT__STORE_URL": store_url,
        "AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "checkpoints"),
        "AIRFLOW__FINALCKPT__CHECKPOINT_INTERVAL_S": "0.2",
        "AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS": "100",  # every _metadata stays to be measured
    }
    state = tmp_path / "state"
    try:
        child = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(RUN_DAG), str(dag_file), key, str(state)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        dag_file.unlink(missing_ok=True)
        listener.close()
    result = state.read_text() if state.exists() else None
    assert result is not None and result.endswith("success"), (
        child.returncode,
        child.stdout[-3000:],
        child.stderr[-3000:],
    )

    engine = make_engine(store_url)
    try:
        checkpoints = Coordinator(engine, key).checkpoints()
    finally:
        engine.dispose()
    completed = [c for c in checkpoints if c.is_completed]
    assert len(completed) >= 3, checkpoints  # periodic ones while source runs, final ones

    durations = listener.metrics("finalckpt.checkpoint.duration")
    assert len(durations) == len(completed), (listener.lines[:40], completed)
    assert {tags["kind"] for tags, _, _ in durations} == {"checkpoint"}
    assert all(kind == "ms" and value >= 0 for _, value, kind in durations)
    expected_ms = sorted(round(((c.completed_at or 0) - c.triggered_at) * 1000) for c in completed)
    assert [round(v) for v in sorted(v for _, v, _ in durations)] == pytest.approx(
        expected_ms, abs=2
    )

    sizes = sorted(value for _, value, _ in listener.metrics("finalckpt.checkpoint.size"))
    on_disk = sorted(os.path.getsize(str(c.metadata_path)) for c in completed)
    assert sizes == on_disk and all(size > 0 for size in sizes)
    assert sorted(c.size_bytes or 0 for c in completed) == on_disk
    state_sizes = listener.metrics("finalckpt.checkpoint.state_size")
    assert len(state_sizes) == len(completed)
    assert max(value for _, value, _ in state_sizes) > 0  # source's output parts while running

    lags = listener.metrics("finalckpt.checkpoint.ack_lag")
    acked = {tags["stage_id"] for tags, _, _ in lags}
    assert acked == {"source", "summary"}, listener.lines
    assert all(kind == "ms" and value >= 0 for _, value, kind in lags)
    last = listener.metrics("finalckpt.checkpoint.last_ack_lag")
    # every checkpoint that waited for an acknowledgement completed on its last one
    waited = [c for c in completed if c.plan.to_ack]
    assert len(last) == len(waited) >= 1, (last, waited)
    assert {tags["stage_id"] for tags, _, _ in last} <= acked
