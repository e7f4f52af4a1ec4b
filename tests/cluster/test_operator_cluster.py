"""The stage operator's spark-submit path on a real Spark standalone cluster, through a real
Airflow ``dag.test()`` (Task SDK context, task state store, retries, inline triggerer).

One stage (6 splits, one per batch) is submitted with ``spark-submit`` in **client** deploy
mode to the fixture's master and two workers; its batches run a slow Python UDF on the
executors and write to a Parquet and a SQL sink. While it runs:

1. after the first durable batch, while the second batch's Spark tasks run, one **worker** is
   SIGKILLed (with its executor): Spark reschedules the tasks on the other worker, the driver
   goes on;
2. once three splits are durable (the driver waits at a gate before the fourth), the **driver**
   (the Python driver and its spark-submit JVM) is SIGKILLed: try 1 fails, Airflow's try 2
   reads the submission record try 1 left in the task state store (``ResumableJobMixin``),
   sees the driver EXITED and submits a new one, which processes only the three unfinished
   splits;
3. once that driver has made splits 3 and 4 durable (it waits at a second gate before 5),
   try 2 itself fails while its driver runs on (the test makes the task's wait raise, as when
   the Airflow worker process dies but the driver does not): try 3 finds the driver RUNNING
   in the task state store and **reattaches** to it instead of submitting; that driver
   finishes split 5.

A downstream stage, submitted by its own task, reads the six output parts of both drivers.
The sinks then hold exactly the rows of one uninterrupted run, every committed sink transaction
is committed once. **Cluster** deploy mode on standalone is refused for Python applications by
Spark itself (checked against the real master with the installed pyspark) and, before
anything is submitted, by the operator: the task fails once, without retries.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.spark.launch import STANDALONE_PYTHON_CLUSTER_MODE
from airflow_finalckpt.spark.launch.resumable import SUBMISSION_STATE_KEY, SubmissionStatus
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

from .conftest import (
    DRIVER_MEMORY,
    EXECUTOR_MEMORY,
    JVM_OPTS,
    PYTHON,
    SPARK_HOME,
    StandaloneCluster,
    spark_env,
    wait_until,
)

SPLITS = [str(i) for i in range(6)]
ROWS = 8  # per split: ids split*ROWS .. split*ROWS+7, over 2 partitions
GATE_FROM = 3  # splits from here on wait for the gate (the driver kill comes first)
GATE2_FROM = 5  # and from here on for the second gate (try 2 fails first, its driver runs on)
#: A hang guard for every wait of the test and of its gates, never a timing assertion: with three
#: cluster tiers beside seven other suites on 2 cores (load 25-29), a driver's first durable batch
#: came 5 minutes after dag.test() started (issue 31), past the 300 s the waits allowed then.
HANG_S = 1200

STAGE_DAG = """
import os
import time
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink


def squares(ctx):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    (split,) = ctx.splits
    n = int(split)
    for gate_from, gate in ((GATE_FROM, GATE), (GATE2_FROM, GATE2)):
        deadline = time.time() + HANG_S
        while n >= gate_from and not os.path.exists(gate):
            if time.time() > deadline:
                raise RuntimeError("the test never opened the gate")
            time.sleep(0.2)
    marks, slow_s = MARKS, SLOW_S

    def slow_square(x):  # runs in the executors' Python workers
        import os
        import time

        open(os.path.join(marks, f"running-{n}"), "a").close()
        time.sleep(slow_s)
        return x * x

    udf = F.udf(slow_square, T.LongType())
    frame = ctx.spark.range(n * ROWS, (n + 1) * ROWS, numPartitions=2)
    return frame.select(F.col("id"), udf(F.col("id")).alias("sq"), F.lit(n).alias("split"))


def total(ctx):
    from pyspark.sql import functions as F

    # this batch's upstream parts, read by the driver a spark-submit of its own started
    return ctx.read_parts().agg(F.count("id").alias("n"), F.sum("sq").alias("sum_sq"))


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    squares = FinalCheckpointStageOperator(
        task_id="squares",
        transform=squares,
        splits=SPLITS,
        batch_size=1,
        checkpoint_interval=3600.0,
        sinks=[
            ParquetTableSink("squares_parquet", OUT + "/parquet"),
            SqlTableSink("squares_sql", "sqlite:///" + OUT + "/out.db", "squares"),
        ],
        spark_master=MASTER,
        spark_execution="submit",
        spark_deploy_mode=DEPLOY_MODE,
        spark_conf=SPARK_CONF,
        retries=RETRIES,
        retry_delay=timedelta(seconds=1),
    )
    totals = FinalCheckpointStageOperator(
        task_id="total",
        transform=total,
        # a global aggregate: the plan check runs its 6 parts as one batch (batch_size="auto")
        checkpoint_interval=3600.0,
        sinks=[SqlTableSink("total_sql", "sqlite:///" + OUT + "/out.db", "totals")],
        spark_master=MASTER,
        spark_execution="submit",
        spark_deploy_mode=DEPLOY_MODE,
        spark_conf=SPARK_CONF,
        retries=0,
    )
    squares >> totals
"""


def _executor_removals(event_dir: Path) -> list[dict[str, Any]]:
    """SparkListenerExecutorRemoved events of every application in the event log dir."""
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


def _spark_conf(events: Path) -> dict[str, str]:
    return {
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.driver.memory": DRIVER_MEMORY,
        "spark.executor.cores": "1",
        "spark.executor.extraJavaOptions": JVM_OPTS,
        "spark.driver.extraJavaOptions": JVM_OPTS,
        "spark.cores.max": "2",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.pyspark.python": PYTHON,
        "spark.shuffle.io.maxRetries": "1",
        "spark.shuffle.io.retryWait": "1s",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.compress": "false",
        "spark.eventLog.dir": f"file://{events}",
    }


@pytest.fixture
def stage_dag(
    airflow_dags_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Any]]:
    """Write the one-stage DAG into Airflow's dags folder (dag.test() needs it parsed) with
    the finalckpt store and storage of this test; returns a builder taking the DAG's params."""
    import importlib.util

    from airflow_finalckpt.hooks import finalckpt as hook_module

    store_url = f"sqlite:///{tmp_path}/coordination.db"
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", store_url)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    for name in list(os.environ):
        if name.startswith("AIRFLOW_CONN_SPARK"):
            monkeypatch.delenv(name)
    hook_module.dispose_engines()
    ensure_schema(make_engine(store_url))
    written: list[Path] = []

    def build(**params: Any) -> Any:
        name = f"cluster_dag_{uuid.uuid4().hex[:12]}"
        params.setdefault("HANG_S", HANG_S)
        header = "".join(f"{key} = {value!r}\n" for key, value in params.items())
        path = airflow_dags_folder / f"{name}.py"
        path.write_text(f"DAG_ID = {name!r}\n" + header + STAGE_DAG)
        written.append(path)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.dag

    yield build
    for path in written:
        path.unlink(missing_ok=True)
    hook_module.dispose_engines()


def _ti(dag_run: Any, task_id: str) -> tuple[str, int]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_run.dag_id,
                TaskInstance.run_id == dag_run.run_id,
                TaskInstance.task_id == task_id,
            )
        ).one()
        return str(ti.state), int(ti.try_number)


def _xcom(dag_run: Any, task_id: str, key: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=dag_run.run_id, key=key, task_ids=task_id, dag_ids=dag_run.dag_id
            )
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def _task_state(dag_run: Any, task_id: str, key: str) -> Any:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalars(
            select(TaskStateStoreModel.value).where(
                TaskStateStoreModel.dag_id == dag_run.dag_id,
                TaskStateStoreModel.run_id == dag_run.run_id,
                TaskStateStoreModel.task_id == task_id,
                TaskStateStoreModel.key == key,
            )
        ).first()
        return None if value is None else json.loads(value)


def _finished(coordinator: Coordinator) -> set[str]:
    try:
        return set(coordinator.stage("squares").progress.finished_splits)
    except Exception:  # not registered yet
        return set()


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _running_driver(checkpoints: Path) -> dict[str, Any]:
    """The heartbeat of the submission of ``squares`` that heartbeats now (a killed driver's
    heartbeat file stays behind, older), once it carries its epoch: a driver heartbeats from its
    start, before it has taken the stage (``"epoch": null``), and a beat follows every 5 s."""

    def with_epoch() -> dict[str, Any] | None:
        docs = []
        pattern = f"{checkpoints}/**/drivers/squares/*/heartbeat.json"
        for path in glob.glob(pattern, recursive=True):
            if not os.path.exists(os.path.join(os.path.dirname(path), "result.json")):
                doc = dict(json.loads(Path(path).read_text()))
                doc["submission_id"] = os.path.basename(os.path.dirname(path))
                docs.append(doc)
        fresh = [d for d in docs if time.time() - float(d["at"]) < 12]
        assert len(fresh) <= 1, docs  # never two live drivers
        return fresh[0] if fresh and fresh[0]["epoch"] is not None else None

    found: dict[str, Any] = wait_until(with_epoch, HANG_S, "a driver heartbeat with its epoch", 0.1)
    return found


@pytest.fixture
def task_dies_on_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Lets the test end a try of the task while its driver runs on, and records what each
    later try decided from the task state store (the task runs in this process: dag.test())."""
    from airflow_finalckpt.spark.launch.resumable import ResumableSubmission

    state: dict[str, Any] = {"crash": tmp_path / "crash-task", "decisions": []}
    own_wait = ResumableSubmission._wait_own_driver
    reattached_wait = ResumableSubmission._wait_reattached
    get_status = ResumableSubmission.get_job_status

    def wait_own_driver(self: Any, record: Any, context: Any) -> None:
        assert self._thread is not None
        while self._thread.is_alive():
            if state["crash"].exists():
                state["crash"].unlink()
                raise RuntimeError("test: the task's try ends here, its driver runs on")
            self._thread.join(0.2)
        own_wait(self, record, context)

    def wait_reattached(self: Any, sid: str) -> None:
        (tmp_path / "reattached").touch()
        reattached_wait(self, sid)

    def get_job_status(self: Any, external_id: Any, context: Any) -> str:
        status = get_status(self, external_id, context)
        state["decisions"].append((external_id["submission_id"], status))
        return status

    monkeypatch.setattr(ResumableSubmission, "_wait_own_driver", wait_own_driver)
    monkeypatch.setattr(ResumableSubmission, "_wait_reattached", wait_reattached)
    monkeypatch.setattr(ResumableSubmission, "get_job_status", get_job_status)
    return state


def test_operator_client_mode_survives_worker_and_driver_kills(
    spark_cluster: StandaloneCluster,
    stage_dag: Callable[..., Any],
    task_dies_on_request: dict[str, Any],
    tmp_path: Path,
) -> None:
    events, marks, out = tmp_path / "spark-events", tmp_path / "marks", tmp_path / "out"
    for d in (events, marks, out):
        d.mkdir()
    gate, gate2 = tmp_path / "gate", tmp_path / "gate2"
    dag = stage_dag(
        SPLITS=SPLITS,
        ROWS=ROWS,
        GATE_FROM=GATE_FROM,
        GATE=str(gate),
        GATE2_FROM=GATE2_FROM,
        GATE2=str(gate2),
        MARKS=str(marks),
        SLOW_S=0.4,
        OUT=str(out),
        MASTER=spark_cluster.url,
        DEPLOY_MODE="client",
        SPARK_CONF=_spark_conf(events),
        RETRIES=2,
    )
    key = f"cluster-op-{uuid.uuid4().hex[:8]}"
    coordinator = Coordinator(make_engine(f"sqlite:///{tmp_path}/coordination.db"), key)
    chaos: dict[str, Any] = {}

    def kill_worker_then_driver() -> None:
        try:
            # 1. a worker, while the second batch's UDF tasks run on the executors
            wait_until(
                lambda: "0" in _finished(coordinator) and (marks / "running-1").exists(),
                HANG_S,
                "split 0 durable and split 1 running",
                interval=0.1,
            )
            victim = spark_cluster.live_worker_daemons()[0]
            chaos["worker_finished_before"] = sorted(_finished(coordinator))
            victim.kill(signal.SIGKILL)
            chaos["worker"] = victim.name
            # 2. the driver, once three splits are durable (it then waits at the gate)
            wait_until(
                lambda: {"0", "1", "2"} <= _finished(coordinator),
                HANG_S,
                "three durable splits",
                interval=0.1,
            )
            beat = _running_driver(tmp_path / "checkpoints")
            driver_pid = int(beat["pid"])
            jvm_pid = _parent(driver_pid)
            with open(f"/proc/{jvm_pid}/cmdline", "rb") as fh:
                assert b"SparkSubmit" in fh.read(), "the driver's parent is not spark-submit"
            chaos["driver_finished_before"] = sorted(_finished(coordinator))
            os.kill(driver_pid, signal.SIGKILL)
            os.kill(jvm_pid, signal.SIGKILL)
            chaos["driver"] = beat
            gate.touch()
            # 3. try 2 ends while its driver (which made 3 and 4 durable) waits at gate 2
            wait_until(
                lambda: {"3", "4"} <= _finished(coordinator),
                HANG_S,
                "splits 3 and 4 durable",
                interval=0.1,
            )
            chaos["second_driver"] = _running_driver(tmp_path / "checkpoints")
            task_dies_on_request["crash"].touch()
            wait_until((tmp_path / "reattached").exists, HANG_S, "try 3 reattached", interval=0.1)
            chaos["second_driver_alive"] = _running_driver(tmp_path / "checkpoints")
        except BaseException as exc:
            chaos["error"] = repr(exc)
        finally:
            gate.touch()
            gate2.touch()

    thread = threading.Thread(target=kill_worker_then_driver, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        dag_run = dag.test(run_conf={"pipeline_key": key})
        elapsed = time.monotonic() - started
        thread.join(timeout=30)
        assert "error" not in chaos, chaos
        assert "worker" in chaos and "driver" in chaos and "second_driver" in chaos, chaos
        assert str(dag_run.state).endswith("success"), dag_run.state
        # try 1 lost its driver, try 2 ended while its driver ran on, try 3 reattached
        assert _ti(dag_run, "squares") == ("success", 3)
        assert _ti(dag_run, "total") == ("success", 1)

        # the worker died mid-stage: the enrich driver of try 1 lost an executor and went on
        assert chaos["worker_finished_before"] == ["0"]
        removed = [e for e in _executor_removals(events) if "squares" in str(e["app"])]
        assert removed, "no executor of the stage's application was removed"
        assert len(spark_cluster.alive_workers()) == 1

        # the driver died after 3 durable splits: try 2 submitted a new driver (the task state
        # store said EXITED) that processed only the three unfinished splits; try 3 found that
        # driver RUNNING and reattached to it (nothing submitted)
        first, second = chaos["driver"]["submission_id"], chaos["second_driver"]["submission_id"]
        assert chaos["driver_finished_before"] == ["0", "1", "2"]
        assert first != second
        assert task_dies_on_request["decisions"] == [
            (first, SubmissionStatus.EXITED),
            (second, SubmissionStatus.RUNNING),
        ]
        sub = _xcom(dag_run, "squares", "spark_submission")  # try 3's
        assert sub["state_store"] == "airflow", sub
        assert sub["previous"] == {"submission_id": second, "status": "RUNNING"}, sub
        assert sub["reconnected"] and sub["submission_id"] == second, sub
        assert sub["epoch"] == int(chaos["second_driver"]["epoch"]) > int(chaos["driver"]["epoch"])
        drivers = glob.glob(
            f"{tmp_path}/checkpoints/**/drivers/squares/*/spec.json", recursive=True
        )
        assert len(drivers) == 2, drivers  # two submissions for three tries
        run = _xcom(dag_run, "squares", "stage_run")
        assert sorted(run["processed_splits"]) == ["3", "4", "5"], run
        assert run["skipped_splits"] == 3, run
        record = _task_state(dag_run, "squares", SUBMISSION_STATE_KEY)
        assert record["submission_id"] == second, record
        assert record["pipeline_key"] == key and "exited_at" not in record

        # exactly once: both sinks hold every row once, every transaction committed once
        expected = sorted((i, i * i, i // ROWS) for i in range(len(SPLITS) * ROWS))
        parquet = ParquetTableSink("squares_parquet", str(out / "parquet"))
        sql = SqlTableSink("squares_sql", f"sqlite:///{out}/out.db", "squares")
        for sink in (parquet, sql):
            frame = sink.read_pandas()
            rows = sorted(
                (int(r.id), int(r.sq), int(r.split)) for r in frame.itertuples(index=False)
            )
            assert rows == expected, (sink.sink_id, len(rows))
        # the downstream stage's own driver read the six parts of both squares drivers
        totals = SqlTableSink("total_sql", f"sqlite:///{out}/out.db", "totals").read_pandas()
        assert len(totals) == 1, totals  # the global aggregate over all 6 parts, once
        assert int(totals["n"].sum()) == len(expected)
        assert int(totals["sum_sq"].sum()) == sum(sq for _, sq, _ in expected)
        assert sorted(_xcom(dag_run, "total", "stage_run")["processed_splits"]) == sorted(
            _xcom(dag_run, "squares", "end_of_data")["manifest"]
        )
        for stage in ("squares", "total"):
            assert coordinator.stage(stage).lifecycle is StageLifecycle.CLOSED
        txns = coordinator.transactions()
        # the killed driver's open transaction (if it had opened one) is aborted, never committed
        assert txns and {state for _, state in txns} <= {"COMMITTED", "ABORTED"}, txns
        ids = [(t.sink_id, t.txn_id) for t, state in txns if state == "COMMITTED"]
        assert len(ids) == len(set(ids))
        assert parquet.committed_txn_ids() == {t for s, t in ids if s == parquet.sink_id}
        assert sql.committed_txn_ids() == {t for s, t in ids if s == sql.sink_id}
        print(
            f"\nclient mode through the operator in {elapsed:.0f}s: killed {chaos['worker']} "
            f"after splits {chaos['worker_finished_before']} (executor removals: "
            f"{[e.get('Removed Reason') for e in removed]}), killed driver pid "
            f"{chaos['driver']['pid']} after splits {chaos['driver_finished_before']}; try 2 "
            f"resubmitted, try 3 reattached ({task_dies_on_request['decisions']}); the second "
            f"driver processed {run['processed_splits']}"
        )
    finally:
        gate.touch()
        gate2.touch()
        spark_cluster.ensure_two_workers()


def test_standalone_cluster_mode_is_refused_by_spark_and_by_the_operator(
    spark_cluster: StandaloneCluster, stage_dag: Callable[..., Any], tmp_path: Path
) -> None:
    # Spark itself (the installed pyspark) refuses a Python application in cluster mode on a
    # standalone master: the operator's refusal names a limit that is real
    app = tmp_path / "app.py"
    app.write_text("print('never runs')\n")
    refused = subprocess.run(
        [
            os.path.join(SPARK_HOME, "bin", "spark-submit"),
            "--master",
            spark_cluster.url,
            "--deploy-mode",
            "cluster",
            str(app),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=spark_env(),
        check=False,
    )
    spark_says = "Cluster deploy mode is currently not supported for python applications"
    assert refused.returncode != 0 and spark_says in refused.stdout + refused.stderr
    assert spark_says in STANDALONE_PYTHON_CLUSTER_MODE

    # the operator refuses before submitting anything, once (a permanent error: no retry)
    out = tmp_path / "out"
    dag = stage_dag(
        SPLITS=SPLITS,
        ROWS=ROWS,
        GATE_FROM=len(SPLITS),
        GATE=str(tmp_path / "gate"),
        GATE2_FROM=len(SPLITS),
        GATE2=str(tmp_path / "gate"),
        MARKS=str(tmp_path),
        SLOW_S=0.0,
        OUT=str(out),
        MASTER=spark_cluster.url,
        DEPLOY_MODE="cluster",
        SPARK_CONF={},
        RETRIES=2,
    )
    dag_run = dag.test(run_conf={"pipeline_key": f"cluster-refused-{uuid.uuid4().hex[:8]}"})
    assert str(dag_run.state).endswith("failed")
    assert _ti(dag_run, "squares") == ("failed", 1)
    assert not glob.glob(f"{tmp_path}/checkpoints/**/drivers", recursive=True)
    assert not out.exists() or not any(out.iterdir())
