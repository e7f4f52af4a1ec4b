"""A planted password is in none of the places Airflow or Spark keep or show after a real run on
the **standalone spark-submit path** (issue 27; the in-process path:
tests/airflow/test_no_secret_in_clear.py).

One stage task (``spark_execution="submit"``, client deploy mode) runs through a real Airflow
``dag.test()`` against the fixture's Spark standalone master and workers, with a PostgreSQL
store URL and a ``SqlTableSink`` URL that both carry the planted password (trust auth ignores
it; the sink writes through it, so the URL is really used). While the driver runs (its
transform waits at a gate the test opens once it has seen them), the test reads the command
lines of every process of the submission (``spark-submit``'s JVM, the Python driver, the
executors). Afterwards the password must be in none of: those command lines, the task log (the
Spark provider's ``Spark-Submit cmd`` line and the driver's output it relays), Airflow's log
files, the executors' logs and Spark's event log, the XComs, the trigger rows and the task
instance's ``next_kwargs``, any file of the checkpoint storage (``code.pkl``, the job spec) and
the plugin's pages and REST answers about the run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from tests.planted_secret import files_holding

from .conftest import (
    DRIVER_MEMORY,
    EXECUTOR_MEMORY,
    JVM_OPTS,
    PYTHON,
    StandaloneCluster,
    wait_until,
)

PLANTED = "Planted-Pw-5ub1t"
HANG_S = 1200  # a hang guard for the gate and the waits, never a timing assertion

DAG_SOURCE = """
import os
import time
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import SqlTableSink


def rows(ctx):
    deadline = time.time() + HANG_S
    while not os.path.exists(GATE):  # opened once the test has seen the driver's processes
        if time.time() > deadline:
            raise RuntimeError("the test never opened the gate")
        time.sleep(0.2)
    return ctx.spark.createDataFrame([(s, 1) for s in ctx.splits], "split string, n long")


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(
        task_id="load",
        transform=rows,
        splits=["a", "b"],
        sinks=[SqlTableSink("planted_sql", SINK_URL, "planted_rows")],
        spark_master=MASTER,
        spark_execution="submit",
        spark_deploy_mode="client",
        spark_conf=SPARK_CONF,
        retries=0,
    )
"""


class CommandLines:
    """Polls the command lines of the submission's processes until stopped: whatever mentions
    the test's directory (spark-submit's JVM and the Python driver carry the job spec's path)
    and Spark's executors."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            for proc in psutil.process_iter(["pid", "cmdline"]):
                line = " ".join(proc.info["cmdline"] or [])
                if self.marker in line or "CoarseGrainedExecutorBackend" in line:
                    self.seen[proc.info["pid"]] = line
            self._stop.wait(0.1)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def spark_submit(self) -> list[str]:
        return [c for c in list(self.seen.values()) if "SparkSubmit" in c]

    def python_driver(self) -> list[str]:
        return [c for c in list(self.seen.values()) if "SparkSubmit" not in c and "--job" in c]


@pytest.fixture
def planted_env(
    airflow_dags_folder: Path, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """The store URL (PostgreSQL, planted password) and storage of this test; the DAG file."""
    from airflow_finalckpt.hooks import finalckpt as hook_module

    url = make_url(pg_url).set(password=PLANTED).render_as_string(hide_password=False)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", url)  # trust auth: any password works
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    for name in list(os.environ):
        if name.startswith("AIRFLOW_CONN_SPARK"):
            monkeypatch.delenv(name)
    hook_module.dispose_engines()
    engine = make_engine(url)
    ensure_schema(engine)
    engine.dispose()
    written: list[Path] = []
    yield {"url": url, "dags": airflow_dags_folder, "written": written}
    for path in written:
        path.unlink(missing_ok=True)
    hook_module.dispose_engines()


def write_dag(env: dict[str, Any], **params: Any) -> Any:
    name = f"planted_submit_{uuid.uuid4().hex[:10]}"
    header = "".join(f"{key} = {value!r}\n" for key, value in params.items())
    path = env["dags"] / f"{name}.py"
    path.write_text(f"DAG_ID = {name!r}\nHANG_S = {HANG_S}\n" + header + DAG_SOURCE)
    env["written"].append(path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def spark_conf(events: Path) -> dict[str, str]:
    return {
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.driver.memory": DRIVER_MEMORY,
        "spark.executor.cores": "1",
        "spark.executor.extraJavaOptions": JVM_OPTS,
        "spark.driver.extraJavaOptions": JVM_OPTS,
        "spark.cores.max": "1",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.pyspark.python": PYTHON,
        "spark.eventLog.enabled": "true",
        "spark.eventLog.compress": "false",
        "spark.eventLog.dir": f"file://{events}",
    }


def plugin_answers(dag_id: str, run_id: str) -> list[str]:
    """The plugin's pages and REST answers about the run, as an admin sees them."""
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow_finalckpt.plugins.api import create_app
    from airflow_finalckpt.plugins.api.control import default_control, reset_default_control

    token = create_auth_manager().generate_jwt(SimpleAuthManagerUser(username="a", role="ADMIN"))
    parent = FastAPI()
    reset_default_control()  # the control service on this test's store
    parent.mount("/finalckpt", create_app(default_control))
    answers = []
    try:
        with TestClient(parent, base_url="http://airflow.test") as client:
            for path in (
                f"/finalckpt/ui/dags/{dag_id}/runs/{run_id}",
                f"/finalckpt/ui/dags/{dag_id}/runs/{run_id}/live",
                "/finalckpt/ui/runs",
                f"/finalckpt/api/dags/{dag_id}/runs/{run_id}",
                f"/finalckpt/api/dags/{dag_id}/runs/{run_id}/checkpoints",
                "/finalckpt/api/runs",
            ):
                resp = client.get(path, headers={"Authorization": f"Bearer {token}"})
                assert resp.status_code == 200, (path, resp.text)
                answers.append(resp.text)
    finally:
        reset_default_control()
    return answers


def test_a_planted_password_is_nowhere_after_a_standalone_spark_submit_run(
    spark_cluster: StandaloneCluster,
    planted_env: dict[str, Any],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from airflow.configuration import conf
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    url = planted_env["url"]
    events, gate = tmp_path / "spark-events", tmp_path / "gate"
    events.mkdir()
    dag = write_dag(
        planted_env,
        SINK_URL=url,
        MASTER=spark_cluster.url,
        SPARK_CONF=spark_conf(events),
        GATE=str(gate),
    )
    outcome: dict[str, Any] = {}

    def open_gate_once_seen() -> None:
        try:
            wait_until(
                lambda: watcher.spark_submit() and watcher.python_driver(),
                HANG_S,
                "spark-submit and its Python driver",
                interval=0.1,
            )
        except BaseException as exc:
            outcome["error"] = repr(exc)
        finally:
            gate.touch()

    with CommandLines(str(tmp_path)) as watcher:
        opener = threading.Thread(target=open_gate_once_seen, daemon=True)
        opener.start()
        dag_run = dag.test()
        opener.join(timeout=30)
    assert "error" not in outcome, outcome
    assert str(dag_run.state).endswith("success"), dag_run.state

    # the command lines of the submission: spark-submit's JVM, the driver, the executors
    assert watcher.spark_submit() and watcher.python_driver(), watcher.seen
    secrets = [c.split("--secrets ", 1)[1].split()[0] for c in watcher.python_driver()]
    assert secrets, watcher.python_driver()  # the credentials went by file...
    assert not any(os.path.exists(path) for path in secrets)  # ...removed once read
    leaking = [c for c in watcher.seen.values() if PLANTED in c]
    assert leaking == []

    # the task log (dag.test() runs the task here: stdout/stderr and stdlib logging), with the
    # Spark provider's "Spark-Submit cmd" line and the driver's output it relays
    captured = capfd.readouterr()
    task_log = captured.out + "\n" + captured.err + "\n" + caplog.text
    assert "Spark-Submit cmd" in task_log
    assert PLANTED not in task_log
    assert (
        files_holding(Path(conf.get("logging", "base_log_folder")), PLANTED, skip_symlinks=True)
        == []
    )
    # executor logs (the workers' work dirs), daemon logs, Spark's event log
    assert any(events.iterdir()), "Spark wrote no event log"
    assert files_holding(spark_cluster.workdir, PLANTED, skip_symlinks=True) == []
    assert files_holding(events, PLANTED, skip_symlinks=True) == []
    # the checkpoint storage: the sealed code.pkl, the job spec, driver records, checkpoints
    checkpoints = tmp_path / "checkpoints"
    assert list(checkpoints.rglob("code.pkl")), "no code.pkl was written"
    assert files_holding(checkpoints, PLANTED, skip_symlinks=True) == []

    with create_session() as session:
        xcoms = session.scalars(select(XComModel).where(XComModel.dag_id == dag.dag_id)).all()
        assert {x.key for x in xcoms} >= {"stage_run", "spark_submission"}
        assert PLANTED not in json.dumps([XComModel.deserialize_value(x) for x in xcoms])
        triggers = session.scalars(select(Trigger)).all()
        assert PLANTED not in json.dumps([t.kwargs for t in triggers], default=str)
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag.dag_id)).all()
        assert PLANTED not in json.dumps([ti.next_kwargs for ti in tis], default=str)

    # the plugin's pages and REST answers about the run
    for answer in plugin_answers(dag.dag_id, dag_run.run_id):
        assert PLANTED not in answer

    # the sink did write through the planted URL: the run was real
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM planted_rows")).scalar() == 2
    engine.dispose()
