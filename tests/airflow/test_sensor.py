"""FinalCheckpointSensor in real DAG runs (``dag.test()``, metadata DB in the temp AIRFLOW_HOME).

The coordination store is a SQLite file reached through an Airflow connection defined in the
environment (as a deployment would), so the sensor resolves it through the Task SDK. In deferrable
mode ``dag.test()`` runs the trigger in-process, exactly the trigger class the triggerer would
import from its classpath.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout
from sqlalchemy import select

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import EndOfData, StageSnapshot
from airflow_finalckpt.hooks import FinalCkptHook
from airflow_finalckpt.hooks.finalckpt import dispose_engines
from airflow_finalckpt.sensors import FinalCheckpointSensor
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import current_revision, ensure_schema, head_revision
from airflow_finalckpt.triggers import StageClosedTrigger

KEY = "sensor-pipeline"

pytestmark = pytest.mark.timeout(180)

SENSOR_DAG = """
import pendulum
from airflow.sdk import DAG
from airflow_finalckpt.sensors import FinalCheckpointSensor

with DAG(DAG_ID, schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False) as dag:
    FinalCheckpointSensor(
        task_id="wait_for_stage",
        pipeline_key="{{ params.pipeline }}",
        stage_id=STAGE_ID,
        finalckpt_conn_id=CONN_ID,
        deferrable=DEFERRABLE,
        mode=MODE,
        poke_interval=0.1,
        timeout=TIMEOUT,
        params={"pipeline": PIPELINE_KEY},
    )
"""


class Store:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = tmp_path / "coordination.db"
        self.url = f"sqlite:///{self.path}"
        self.engine = make_engine(self.url)
        ensure_schema(self.engine)
        self.coordinator = Coordinator(self.engine, KEY)
        self.conn_id = f"finalckpt_test_{uuid.uuid4().hex[:8]}"
        # A sqlite connection keeps the file path in host (as Airflow's SqliteHook does).
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{self.conn_id.upper()}",
            json.dumps({"conn_type": "sqlite", "host": str(self.path)}),
        )

    def close_stage(self, stage_id: str) -> int:
        """Run a stage through finish and close; returns the checkpoint it closed on."""
        self.coordinator.register(StageGraph.build([Stage(stage_id)]))
        epoch = self.coordinator.start_attempt(stage_id).epoch
        outcome = self.coordinator.finish(
            stage_id, epoch, StageSnapshot(end_of_data=EndOfData(manifest=["part-0"]))
        )
        assert outcome.eager_checkpoint_id is not None
        self.coordinator.close(stage_id, epoch, outcome.eager_checkpoint_id)
        return outcome.eager_checkpoint_id


@pytest.fixture
def store(airflow_home: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    s = Store(tmp_path, monkeypatch)
    yield s
    s.engine.dispose()
    dispose_engines()


@pytest.fixture
def sensor_dag(write_dag: Callable[..., Any], store: Store) -> Callable[..., Any]:
    def make(
        stage_id: str, *, deferrable: bool = True, mode: str = "poke", timeout: float = 30
    ) -> Any:
        return write_dag(
            SENSOR_DAG,
            DAG_ID=f"sensor_{uuid.uuid4().hex[:10]}",
            PIPELINE_KEY=KEY,
            STAGE_ID=stage_id,
            CONN_ID=store.conn_id,
            DEFERRABLE=deferrable,
            MODE=mode,
            TIMEOUT=timeout,
        )

    return make


def output(capfd: Any, caplog: Any) -> str:
    """Everything the run logged: Airflow logs through stdlib logging and structlog (stdout, or
    stderr once a CLI command ran in this process: ``cli._shared.logs_to_stderr``).
    """
    captured = capfd.readouterr()
    return captured.out + "\n" + captured.err + "\n" + caplog.text


def task_result(dag_run: Any, task_id: str = "wait_for_stage") -> tuple[str, Any]:
    """(state, XCom return value) of a task of a finished dag.test() run."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_run.dag_id,
                TaskInstance.run_id == dag_run.run_id,
                TaskInstance.task_id == task_id,
            )
        ).one()
        value = session.scalars(
            select(XComModel.value).where(
                XComModel.dag_id == dag_run.dag_id,
                XComModel.run_id == dag_run.run_id,
                XComModel.task_id == task_id,
                XComModel.key == "return_value",
            )
        ).first()
        return str(ti.state), value


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferrable", "poke"])
def test_succeeds_with_the_closed_checkpoint_id(
    store: Store, sensor_dag: Callable[..., Any], deferrable: bool
) -> None:
    closed_on = store.close_stage("publish")
    dag = sensor_dag("publish", deferrable=deferrable)

    dag_run = dag.test()

    assert str(dag_run.state) == "success"
    state, value = task_result(dag_run)
    assert state == "success"
    assert value == closed_on


def test_deferred_sensor_resumes_when_the_stage_closes(
    store: Store,
    sensor_dag: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    capfd: Any,
    caplog: Any,
) -> None:
    """The stage closes while the sensor is deferred: the trigger's event resumes the task."""
    store.coordinator.register(StageGraph.build([Stage("publish")]))
    epoch = store.coordinator.start_attempt("publish").epoch
    polled = threading.Event()
    real_poll = StageClosedTrigger._poll

    def poll(self: StageClosedTrigger) -> Any:
        result = real_poll(self)
        polled.set()
        return result

    monkeypatch.setattr(StageClosedTrigger, "_poll", poll)
    closed_on: list[int] = []

    def finish_and_close_later() -> None:
        # Only once the trigger has seen the stage still open, so the task really deferred.
        if not polled.wait(60):
            return
        outcome = store.coordinator.finish("publish", epoch, StageSnapshot())
        assert outcome.eager_checkpoint_id is not None
        store.coordinator.close("publish", epoch, outcome.eager_checkpoint_id)
        closed_on.append(outcome.eager_checkpoint_id)

    closer = threading.Thread(target=finish_and_close_later, daemon=True)
    closer.start()
    dag_run = sensor_dag("publish", deferrable=True).test()
    closer.join(10)

    assert polled.is_set(), "the sensor never deferred to StageClosedTrigger"
    assert str(dag_run.state) == "success"
    assert task_result(dag_run) == ("success", closed_on[0])
    assert "[DAG TEST] running trigger in line" in output(capfd, caplog)


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferrable", "poke"])
def test_times_out_with_a_clear_message(
    store: Store, sensor_dag: Callable[..., Any], deferrable: bool, capfd: Any, caplog: Any
) -> None:
    store.coordinator.register(StageGraph.build([Stage("publish")]))
    store.coordinator.start_attempt("publish")  # RUNNING, never finishes
    dag = sensor_dag("publish", deferrable=deferrable, timeout=1)

    started = time.monotonic()
    dag_run = dag.test()

    assert time.monotonic() - started < 60
    assert str(dag_run.state) == "failed"
    assert task_result(dag_run) == ("failed", None)
    out = output(capfd, caplog)
    assert (
        "AirflowSensorTimeout: FinalCheckpointSensor timed out after 1 s waiting for stage "
        "'publish' of pipeline 'sensor-pipeline' to close" in out
    )
    if not deferrable:
        assert "last seen: is RUNNING" in out


def test_unknown_connection_fails_clearly(
    store: Store, write_dag: Callable[..., Any], capfd: Any, caplog: Any
) -> None:
    store.close_stage("publish")
    dag = write_dag(
        SENSOR_DAG,
        DAG_ID=f"sensor_{uuid.uuid4().hex[:10]}",
        PIPELINE_KEY=KEY,
        STAGE_ID="publish",
        CONN_ID="finalckpt_missing",
        DEFERRABLE=True,
        MODE="poke",
        TIMEOUT=5,
    )

    dag_run = dag.test()

    assert task_result(dag_run) == ("failed", None)
    assert "Airflow connection 'finalckpt_missing' is not defined" in output(capfd, caplog)


@pytest.mark.parametrize(
    ("event", "error", "match"),
    [
        (
            {"status": "error", "message": "UnknownStageError: stage 'x' is not part of it"},
            AirflowException,
            "waiting for stage 'publish' of pipeline 'p' failed: UnknownStageError",
        ),
        ({"status": "timeout", "message": "timed out after 3 s"}, AirflowSensorTimeout, "3 s"),
        (None, AirflowException, "without an event"),
        ({"status": "bogus"}, AirflowException, "unexpected event"),
    ],
)
def test_execute_complete_turns_bad_events_into_failures(
    event: Any, error: type[Exception], match: str
) -> None:
    sensor = FinalCheckpointSensor(task_id="wait", pipeline_key="p", stage_id="publish")

    with pytest.raises(error, match=match):
        sensor.execute_complete({}, event)
    assert sensor.execute_complete({}, {"status": "closed", "checkpoint_id": 7}) == 7


def test_sensor_declares_its_template_fields_and_defaults() -> None:
    sensor = FinalCheckpointSensor(task_id="wait", pipeline_key="p", stage_id="s")

    assert {"pipeline_key", "stage_id"} <= set(sensor.template_fields)
    assert sensor.deferrable is True
    assert sensor.finalckpt_conn_id == "finalckpt_default"


# ---------------------------------------------------------------------------------- the hook


@pytest.fixture
def clean_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    from airflow_finalckpt import config

    for name in list(os.environ):
        if name.startswith(("AIRFLOW__FINALCKPT__", "AIRFLOW_CONN_FINALCKPT")):
            monkeypatch.delenv(name)
    monkeypatch.setattr(config, "_read_airflow_cfg", lambda _name: None)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    return tmp_path


def sqlite_conn(path: Path) -> str:
    return json.dumps({"conn_type": "sqlite", "host": str(path)})


def test_hook_uses_the_default_connection(
    clean_settings: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = clean_settings / "from-conn.db"
    monkeypatch.setenv("AIRFLOW_CONN_FINALCKPT_DEFAULT", sqlite_conn(db))

    settings = FinalCkptHook().get_settings()

    assert settings.store_url == f"sqlite:///{db}"
    assert settings.sources["store_url"] == "Airflow connection finalckpt_default"
    assert settings.storage_uri == str(clean_settings / "checkpoints")


def test_hook_falls_back_to_load_settings(clean_settings: Path) -> None:
    settings = FinalCkptHook().get_settings()

    assert settings.sources["store_url"] == "default"
    assert settings.store_url.endswith("/finalckpt/coordination.db")


def test_explicit_setting_beats_the_default_connection_like_load_settings(
    clean_settings: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_FINALCKPT_DEFAULT", sqlite_conn(clean_settings / "c.db"))
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", f"sqlite:///{clean_settings / 'e.db'}")

    assert FinalCkptHook().get_settings().store_url == f"sqlite:///{clean_settings / 'e.db'}"
    # ...but a connection named explicitly wins.
    monkeypatch.setenv("AIRFLOW_CONN_FINALCKPT_PROD", sqlite_conn(clean_settings / "p.db"))
    hook = FinalCkptHook(finalckpt_conn_id="finalckpt_prod")
    assert hook.get_settings().store_url == f"sqlite:///{clean_settings / 'p.db'}"


def test_postgres_connection_becomes_a_psycopg_url(
    clean_settings: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_FINALCKPT_DEFAULT",
        "postgres://ckpt:p%40ss@db.example:6432/coord?sslmode=require&cursor=dictcursor",
    )

    settings = FinalCkptHook().get_settings()

    assert settings.store_url == (
        "postgresql+psycopg://ckpt:p%40ss@db.example:6432/coord?sslmode=require"
    )
    assert "p%40ss" not in repr(settings)


def test_unusable_connection_type_is_a_clear_error(
    clean_settings: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_FINALCKPT_DEFAULT", "http://example.com")

    with pytest.raises(ConfigurationError, match="'finalckpt_default' cannot hold the coord"):
        FinalCkptHook().get_settings()


def test_hook_resources(clean_settings: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = clean_settings / "store.db"
    monkeypatch.setenv("AIRFLOW_CONN_FINALCKPT_DEFAULT", sqlite_conn(db))
    hook = FinalCkptHook()

    engine = hook.get_engine()
    assert hook.get_engine() is engine is FinalCkptHook().get_engine(), "one engine per URL"
    assert current_revision(engine) == head_revision()
    assert hook.get_storage().root_uri == str(clean_settings / "checkpoints")

    coordinator = hook.get_coordinator("hook-pipeline")
    coordinator.register(StageGraph.build([Stage("only")]))
    epoch = coordinator.start_attempt("only").epoch
    eager = coordinator.finish("only", epoch, StageSnapshot()).eager_checkpoint_id
    assert eager is not None
    info = coordinator.checkpoint(eager)
    assert info.metadata_path is not None and Path(info.metadata_path).is_file()
    assert str(info.metadata_path).startswith(str(clean_settings / "checkpoints"))
    dispose_engines()
