"""The example pipeline on a real multi-process Spark cluster.

1. Every stage is submitted with ``spark-submit`` (client deploy mode, through the Spark
   provider's ``SparkSubmitHook``) to a standalone master with two workers; the Spark driver runs
   the stage runtime and talks to the coordination store and checkpoint storage itself. After the
   first durable batch of ``enrich`` one worker is SIGKILLed (with its executor): the stage
   still completes exactly once, the sinks equal the pandas reference row for row and every
   sink transaction is COMMITTED once.
2. The pipeline through a local Spark Connect server (``sc://``): the runtime in this process,
   the Spark work on the server.
3. Standalone cluster deploy mode for a Python application is refused with a clear message.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.core.coordinator import Coordinator
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.core.model import EndOfData, StageLifecycle
from airflow_finalckpt.examples.nycflights13.data import first_days, open_layout, prepare_inputs
from airflow_finalckpt.examples.nycflights13.local import example_graph
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.examples.nycflights13.stages import example_stages
from airflow_finalckpt.runtime.runner import RunStatus, StageRunner, StageSpec
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.spark.launch import ExecutionMode, SparkTarget, resolve_target
from airflow_finalckpt.spark.submit import Files, SubmitLauncher
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

from .conftest import DRIVER_MEMORY, EXECUTOR_MEMORY, PYTHON, StandaloneCluster, wait_until

DAYS = first_days(14)
#: 14 days -> 2 ingest parts -> 2 enrich batches: the worker dies between them.
BATCHES = {"ingest": 7, "enrich": 1, "delay_windows": 2, "publish": 2}


class _NoLogic:
    def restore(self, state: Any, watermark: Any) -> None:
        raise AssertionError("closing needs no Spark")

    def process(self, batch: Any, txn_ids: Any) -> Any:
        raise AssertionError("closing needs no Spark")

    def finish(self, drain: bool, txn_ids: Any) -> Any:
        raise AssertionError("closing needs no Spark")


def _env(tmp_path: Path, days: Sequence[Any]) -> dict[str, Any]:
    inputs = tmp_path / "inputs"
    prepare_inputs(inputs, days=days)
    store_url = f"sqlite:///{tmp_path}/store.db"
    engine = make_engine(store_url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    sinks = [
        ParquetTableSink("windows_parquet", str(tmp_path / "out" / "windows")),
        SqlTableSink("windows_sql", f"sqlite:///{tmp_path}/out.db", "delay_windows"),
    ]
    return {
        "inputs": str(inputs),
        "store_url": store_url,
        "coordinator": Coordinator(engine, "nyc", writer=storage),
        "storage": storage,
        "sinks": sinks,
    }


def _close(coordinator: Coordinator, runner: StageRunner, timeout: float = 60) -> EndOfData:
    """What the Airflow task does after the driver returned (deferred there, polled here)."""
    deadline = time.monotonic() + timeout
    eod = runner.try_close()
    while eod is None:
        assert time.monotonic() < deadline, f"{runner.spec.stage_id} never closed"
        coordinator.ensure_final_checkpoint(runner.spec.stage_id)
        time.sleep(0.1)
        eod = runner.try_close()
    return eod


def run_pipeline_submitted(
    target: SparkTarget,
    env: Mapping[str, Any],
    spark_conf: Mapping[str, str],
    *,
    before_stage: Any = None,
) -> dict[str, Any]:
    """Each stage through spark-submit, then closed here as the Airflow task would."""
    coordinator: Coordinator = env["coordinator"]
    coordinator.register(example_graph())
    layout = open_layout(env["inputs"])
    eods: dict[str, EndOfData] = {}
    outcomes: dict[str, Any] = {}
    for stage in example_stages(env["inputs"]):
        sid = stage.stage_id
        splits = (
            layout.split_ids
            if stage.primary_input is None
            else tuple(eods[stage.primary_input].manifest)
        )
        sinks = list(env["sinks"]) if sid == "publish" else []
        launcher = SubmitLauncher(
            target,
            env["storage"],
            store_url=env["store_url"],
            store_url_masked=env["store_url"],
            spark_conf=spark_conf,
            app_name=f"finalckpt-test-{sid}",
        )
        job, code = launcher.build_job(
            pipeline_key=coordinator.pipeline_key,
            stage_id=sid,
            splits=splits,
            batch_size=BATCHES[sid],
            checkpoint_interval_s=3600.0,
            commit_mode="progressive",
            upstream_manifests={k: list(v.manifest) for k, v in eods.items()},
            transform=stage.transform,
            on_finish=stage.on_finish,
            sinks=sinks,
        )
        if before_stage is not None:
            before_stage(sid)
        started = time.monotonic()
        outcome = launcher.run(job, code)
        print(f"\n{sid}: driver {outcome.app_id} done in {time.monotonic() - started:.1f}s")
        assert outcome.result.status is RunStatus.FINISHED, outcome
        outcomes[sid] = outcome
        runner = StageRunner(
            coordinator,
            StageSpec(pipeline_key=coordinator.pipeline_key, stage_id=sid, splits=splits),
            _NoLogic(),
            sinks,
        )
        runner.epoch = outcome.epoch
        eods[sid] = _close(coordinator, runner)
    return {"eods": eods, "outcomes": outcomes}


def _check_exactly_once(env: Mapping[str, Any], days: Sequence[Any]) -> None:
    coordinator: Coordinator = env["coordinator"]
    expected = reference_pipeline(days)
    parquet, sql = env["sinks"]
    for actual in (parquet.read_pandas(), sql.read_pandas()):
        assert_windows_match(actual, expected.windows)
    assert all(v.lifecycle is StageLifecycle.CLOSED for v in coordinator.stages().values())
    txns = coordinator.transactions()
    assert txns and {state for _, state in txns} == {"COMMITTED"}, txns
    ids = [(t.sink_id, t.txn_id) for t, _ in txns]
    assert len(ids) == len(set(ids))
    # Each committed transaction is recorded once by each sink (no replayed duplicate commit).
    assert parquet.committed_txn_ids() == {t for s, t in ids if s == parquet.sink_id}
    assert sql.committed_txn_ids() == {t for s, t in ids if s == sql.sink_id}


def _executor_removals(event_dir: Path) -> list[dict[str, Any]]:
    removed = []
    for app_dir in glob.glob(str(event_dir / "*")):
        app = None
        for path in sorted(glob.glob(f"{app_dir}/events_*")) or [app_dir]:
            with open(path, errors="replace") as fh:
                lines = fh.readlines()
            for line in lines:
                event = json.loads(line)
                if event.get("Event") == "SparkListenerApplicationStart":
                    app = event.get("App Name")
                if event.get("Event") == "SparkListenerExecutorRemoved":
                    removed.append({"app": app, **event})
    return removed


def test_pipeline_through_spark_submit_survives_a_worker_kill(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    env = _env(tmp_path, DAYS)
    events = tmp_path / "spark-events"
    events.mkdir()
    conf = {
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.driver.memory": DRIVER_MEMORY,
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.pyspark.python": PYTHON,
        # A dead executor's shuffle files: give up on them quickly (defaults wait 15 s).
        "spark.shuffle.io.maxRetries": "1",
        "spark.shuffle.io.retryWait": "1s",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.compress": "false",
        "spark.eventLog.dir": f"file://{events}",
    }
    target = resolve_target(
        spark_master=spark_cluster.url,
        spark_conn_id=None,
        deploy_mode="client",
        lookup=False,
    )
    assert target.mode is ExecutionMode.SUBMIT and target.deploy_mode == "client"
    coordinator: Coordinator = env["coordinator"]
    kill: dict[str, Any] = {}

    def kill_a_worker_after_first_enrich_batch() -> None:
        def first_batch_durable() -> bool:
            return bool(coordinator.stage("enrich").progress.finished_splits)

        wait_until(first_batch_durable, 240, "the first durable enrich batch", interval=0.2)
        victim = spark_cluster.live_worker_daemons()[0]
        kill["finished_before"] = len(coordinator.stage("enrich").progress.finished_splits)
        kill["total"] = len(coordinator.stage("enrich").progress.finished_splits)
        victim.kill(signal.SIGKILL)
        kill["worker"] = victim.name
        kill["at"] = time.time()

    def before_stage(stage_id: str) -> None:
        if stage_id == "enrich":
            threading.Thread(target=kill_a_worker_after_first_enrich_batch, daemon=True).start()

    try:
        run = run_pipeline_submitted(target, env, conf, before_stage=before_stage)
        assert "worker" in kill, "the worker was never killed"
        enrich = coordinator.stage("enrich")
        splits = len(run["eods"]["ingest"].manifest)
        assert kill["finished_before"] < splits, "the kill came after enrich had finished"
        # The driver of enrich lost an executor with the worker and still finished all splits.
        removed = [e for e in _executor_removals(events) if "enrich" in str(e["app"])]
        assert removed, "no executor of the enrich application was removed"
        alive = spark_cluster.alive_workers()
        assert len(alive) == 1, alive
        assert set(enrich.progress.finished_splits) == set(run["eods"]["ingest"].manifest)
        # exactly one driver submission per stage, each its own Spark application
        for sid, outcome in run["outcomes"].items():
            assert not outcome.reconnected
            assert outcome.app_id and outcome.app_id.startswith("app-"), (sid, outcome)
        print(
            f"\nkilled {kill['worker']} (SIGKILL) after {kill['finished_before']}/{splits} "
            f"enrich splits were durable; executor removals in enrich: "
            f"{[e.get('Removed Reason') for e in removed]}; alive workers now: {len(alive)}"
        )
        _check_exactly_once(env, DAYS)
    finally:
        spark_cluster.ensure_two_workers()


def test_reconnects_to_a_running_driver_instead_of_submitting_again(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """A recorded submission whose driver still heartbeats is waited for, not resubmitted."""
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    files = Files(storage, "nyc", "enrich")
    current = {"submission_id": "s1", "submitted_at": time.time()}
    files.write(None, "current.json", json.dumps(current).encode())
    files.write("s1", "heartbeat.json", json.dumps({"at": time.time(), "epoch": 3}).encode())
    submitted: list[Any] = []
    launcher = SubmitLauncher(
        SparkTarget(ExecutionMode.SUBMIT, spark_cluster.url, "client"),
        storage,
        store_url="sqlite://",
        store_url_masked="sqlite://",
        poll_interval_s=0.05,
        hook_factory=lambda **kw: submitted.append(kw),
    )

    def finish_later() -> None:
        time.sleep(0.5)
        doc = {"result": {"status": "finished", "epoch": 3, "processed_splits": ["a"]}}
        files.write("s1", "result.json", json.dumps(doc).encode())

    # the driver "finishes" only once the launcher decided to reconnect (no timing race)
    reconnect = launcher._reconnect

    def reconnect_then_finish(files_: Files, sid: str) -> Any:
        threading.Thread(target=finish_later, daemon=True).start()
        return reconnect(files_, sid)

    launcher._reconnect = reconnect_then_finish  # type: ignore[method-assign]
    job, code = launcher.build_job(
        pipeline_key="nyc",
        stage_id="enrich",
        splits=["a"],
        batch_size=1,
        checkpoint_interval_s=60,
        commit_mode="progressive",
        upstream_manifests={},
        transform=lambda ctx: None,
        on_finish=None,
        sinks=[],
    )
    outcome = launcher.run(job, code)
    assert outcome.reconnected and outcome.epoch == 3 and outcome.submission_id == "s1"
    assert outcome.result.processed_splits == ("a",)
    assert submitted == []  # nothing was submitted


def test_standalone_cluster_deploy_mode_is_refused_for_python(
    spark_cluster: StandaloneCluster,
) -> None:
    with pytest.raises(ConfigurationError, match="standalone does not support cluster deploy"):
        resolve_target(
            spark_master=spark_cluster.url, spark_conn_id=None, deploy_mode="cluster", lookup=False
        )


CONNECT_CHILD = """
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from pyspark.sql import SparkSession

from airflow_finalckpt.examples.nycflights13.data import first_days
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.runtime.runner import RunStatus
from tests.cluster.test_spark_cluster import _env

env = _env(Path(sys.argv[3]), first_days(int(sys.argv[4])))
spark = SparkSession.builder.remote(sys.argv[2]).getOrCreate()
assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
try:
    run = run_example_locally(
        spark,
        env["inputs"],
        env["coordinator"],
        env["storage"],
        env["sinks"],
        batch_sizes={"ingest": 3, "enrich": 1, "delay_windows": 2, "publish": 2},
        checkpoint_interval_s=3600.0,
    )
finally:
    spark.stop()
assert all(r.status is RunStatus.FINISHED for r in run.results.values()), run.results
print("connect pipeline finished")
"""


def test_pipeline_through_spark_connect(spark_connect_server: Any, tmp_path: Path) -> None:
    """Every stage's runtime in a client process, its Spark work on the Connect server.

    The client runs in its own process: pyspark refuses a remote session in a process that
    already has a classic one (the suite's shared local session), as an Airflow worker would
    not have both either.
    """
    days = first_days(6)
    env = _env(tmp_path, days)
    target = resolve_target(spark_master=spark_connect_server.url, spark_conn_id=None, lookup=False)
    assert target.mode is ExecutionMode.CONNECT
    root = str(Path(__file__).resolve().parents[2])
    child = subprocess.run(
        [sys.executable, "-c", CONNECT_CHILD, root, target.master, str(tmp_path), str(len(days))],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        cwd=root,
    )
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    assert "connect pipeline finished" in child.stdout
    _check_exactly_once(env, days)
    assert os.path.exists(spark_connect_server.daemon.log)
