"""Execution mode selection (connection / config / operator args) and the submit wiring of the
stage operator, without a Spark cluster (tests/cluster runs the real thing)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import EndOfData
from airflow_finalckpt.operators.stage import SPARK_SUBMISSION_KEY, FinalCheckpointStageOperator
from airflow_finalckpt.runtime.assembly import StageCode, StageJob
from airflow_finalckpt.runtime.runner import RunResult, RunStatus, StageSpec
from airflow_finalckpt.spark import job as driver_job
from airflow_finalckpt.spark.launch import EXECUTION_ENV, ExecutionMode, resolve_target, submit
from airflow_finalckpt.spark.sealed_spec import open_spec
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

CONN = "AIRFLOW_CONN_SPARK_DEFAULT"


def _op(**kwargs: Any) -> FinalCheckpointStageOperator:
    from airflow.sdk import DAG

    with DAG(f"modes_{id(kwargs)}", schedule=None, start_date=datetime(2026, 1, 1)):
        return FinalCheckpointStageOperator(task_id="s", transform=lambda c: None, **kwargs)


@pytest.fixture
def no_spark_env(airflow_home: Any, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(CONN, raising=False)
    monkeypatch.delenv(EXECUTION_ENV, raising=False)
    return monkeypatch


def _conn(monkeypatch: pytest.MonkeyPatch, value: Any) -> None:
    monkeypatch.setenv(CONN, value if isinstance(value, str) else json.dumps(value))


def test_default_is_in_process_local(no_spark_env: pytest.MonkeyPatch) -> None:
    target = _op()._spark_target()
    assert (target.mode, target.master) == (ExecutionMode.IN_PROCESS, "local[*]")


def test_spark_master_connection_without_deploy_mode_is_in_process_client(
    no_spark_env: pytest.MonkeyPatch,
) -> None:
    _conn(no_spark_env, "spark://10.0.0.5:7077")
    target = _op()._spark_target()
    assert (target.mode, target.master) == (ExecutionMode.IN_PROCESS, "spark://10.0.0.5:7077")


def test_deploy_mode_extra_selects_spark_submit(no_spark_env: pytest.MonkeyPatch) -> None:
    _conn(
        no_spark_env,
        {"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077,
         "extra": {"deploy-mode": "client"}},
    )  # fmt: skip
    target = _op()._spark_target()
    assert target.mode is ExecutionMode.SUBMIT
    assert (target.master, target.deploy_mode) == ("spark://10.0.0.5:7077", "client")


def test_yarn_cluster_mode(no_spark_env: pytest.MonkeyPatch) -> None:
    _conn(no_spark_env, {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}})
    target = _op()._spark_target()
    assert (target.mode, target.master, target.deploy_mode) == (
        ExecutionMode.SUBMIT,
        "yarn",
        "cluster",
    )


def test_execution_extra_and_env_and_operator_arg(no_spark_env: pytest.MonkeyPatch) -> None:
    _conn(
        no_spark_env,
        {"conn_type": "spark", "host": "spark://m", "port": 7077,
         "extra": {"deploy-mode": "client", "finalckpt-execution": "in-process"}},
    )  # fmt: skip
    assert _op()._spark_target().mode is ExecutionMode.IN_PROCESS
    assert _op(spark_execution="submit")._spark_target().mode is ExecutionMode.SUBMIT
    _conn(no_spark_env, "spark://m:7077")
    no_spark_env.setenv(EXECUTION_ENV, "submit")
    target = _op()._spark_target()
    assert (target.mode, target.deploy_mode) == (ExecutionMode.SUBMIT, "client")


def test_spark_connect_from_connection_and_master(no_spark_env: pytest.MonkeyPatch) -> None:
    _conn(no_spark_env, {"conn_type": "spark_connect", "host": "connect.svc", "port": 15002})
    target = _op()._spark_target()
    assert target.mode is ExecutionMode.CONNECT
    assert target.master.startswith("sc://connect.svc:15002")
    target = _op(spark_master="sc://127.0.0.1:15002")._spark_target()
    assert (target.mode, target.master) == (ExecutionMode.CONNECT, "sc://127.0.0.1:15002")


def test_refusals_name_the_reason(no_spark_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="standalone does not support cluster deploy"):
        _op(spark_master="spark://m:7077", spark_deploy_mode="cluster")._spark_target()
    with pytest.raises(ConfigurationError, match="needs execution mode submit"):
        _op(spark_execution="in-process", spark_deploy_mode="cluster")._spark_target()
    with pytest.raises(ConfigurationError, match="Spark Connect URL"):
        _op(spark_master="sc://h:1", spark_execution="submit")._spark_target()
    with pytest.raises(ConfigurationError, match="is not one of"):
        resolve_target(spark_master=None, spark_conn_id=None, execution="remote", lookup=False)


# ----------------------------------------------------------------------------- code shipping


def test_code_from_an_airflow_dag_file_is_pickled_by_value(tmp_path: Path) -> None:
    """DAG files are imported under names no other process can import: their functions must
    travel by value, and importable functions by reference."""
    import importlib.util

    dag_file = tmp_path / "my_dag.py"
    dag_file.write_text("FACTOR = 3\n\ndef transform(x):\n    return x * FACTOR\n")
    spec = importlib.util.spec_from_file_location("unusual_prefix_abc_my_dag", dag_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert submit.code_reference(module.transform) is None
        blob = submit.pickle_code({"transform": module.transform}, "s")
    finally:
        del sys.modules[spec.name]
    (tmp_path / "code.pkl").write_bytes(blob)
    check = "import pickle,sys; print(pickle.load(open(sys.argv[1], 'rb'))['transform'](5))"
    out = subprocess.run(
        [sys.executable, "-c", check, str(tmp_path / "code.pkl")],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path.parent,
    )
    assert out.stdout.strip() == "15"
    from airflow_finalckpt.examples.nycflights13.stages import windows_transform

    ref = submit.code_reference(windows_transform)
    assert ref == "airflow_finalckpt.examples.nycflights13.stages:windows_transform"
    assert driver_job.resolve_reference(ref) is windows_transform


def test_unpicklable_code_is_refused_clearly() -> None:
    lock = threading.Lock()
    with pytest.raises(submit.CodeShippingError, match="its transform cannot be shipped"):
        submit.pickle_code({"transform": lambda ctx: lock}, "s")


# ----------------------------------------------------------------------------- operator wiring


class _TI:
    def __init__(self) -> None:
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def test_operator_submits_and_hands_the_driver_epoch_to_closing(
    no_spark_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    op = _op(spark_master="spark://m:7077", spark_deploy_mode="client")
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "ckpt"))
    coordinator = Coordinator(engine, "p", writer=storage)
    coordinator.register(StageGraph.from_edges(["s"], []))
    seen: dict[str, Any] = {}

    def fake_run(
        self: submit.SubmitLauncher, job: driver_job.DriverJob, code: Any, context: Any = None
    ) -> Any:
        seen["job"] = job
        seen["context"] = context
        seen["target"] = self.target
        eod = EndOfData(manifest=["data/s/x"])
        return driver_job.DriverOutcome(
            RunResult(RunStatus.FINISHED, eod, ("a",)), 7, job.submission_id
        )

    no_spark_env.setattr(submit.SubmitLauncher, "run", fake_run)

    class Settings:
        store_url = f"sqlite:///{tmp_path}/store.db"
        storage_options: ClassVar[dict[str, Any]] = {}
        checkpoint_interval_s = 60.0

        def masked_store_url(self) -> str:
            return self.store_url

    ti = _TI()
    run = op._run_stage({"ti": ti}, "p", coordinator, Settings(), storage, ["a"], {})  # type: ignore[arg-type]
    assert run.epoch == 7 and run.closer.epoch == 7 and run.spark_started
    assert run.result.end_of_data is not None and run.result.end_of_data.manifest == ["data/s/x"]
    assert seen["target"].deploy_mode == "client" and seen["job"].splits == ("a",)
    assert ti.xcoms[SPARK_SUBMISSION_KEY]["epoch"] == 7
    assert seen["context"] == {"ti": ti}  # the task's context reaches the resumable job


# ----------------------------------------------------------------------------- resumable job


class _StateStore:
    """What ``context["task_state_store"]`` offers (get/set), in memory."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, **_kw: Any) -> None:
        assert value is not None
        self.values[key] = json.loads(json.dumps(value))  # JSON, as the real store keeps it


TEST_SIGNING_KEY = "a-test-signing-key"


class _Hook:
    """A SparkSubmitHook stand-in: submit() runs a 'driver' that writes result.json."""

    def __init__(self, files: driver_job.Files, submitted: list[str], **kwargs: Any) -> None:
        self.files, self.submitted, self.kwargs = files, submitted, kwargs

    def submit(self, application: str) -> None:
        spec = self.kwargs["application_args"][1]
        sid = open_spec(Path(spec).read_bytes(), TEST_SIGNING_KEY, spec).job.submission_id
        self.submitted.append(sid)
        doc = {"result": {"status": "finished", "epoch": 9, "processed_splits": ["a"]}}
        self.files.write(sid, "result.json", json.dumps(doc).encode())

    def on_kill(self) -> None:
        pass


def _launcher(
    tmp_path: Path, submitted: list[str], stale_s: float = 30.0
) -> tuple[submit.SubmitLauncher, driver_job.Files]:
    from airflow_finalckpt.spark.launch import SparkTarget

    storage = CheckpointStorage(str(tmp_path / "ckpt"))
    files = driver_job.Files(storage, "nyc", "enrich")
    launcher = submit.SubmitLauncher(
        SparkTarget(ExecutionMode.SUBMIT, "spark://m:7077", "client"),
        storage,
        store_url="sqlite://",
        store_url_masked="sqlite://",
        poll_interval_s=0.05,
        heartbeat_stale_s=stale_s,
        hook_factory=lambda **kw: _Hook(files, submitted, **kw),
        code_signing_key=TEST_SIGNING_KEY,  # no store to keep a generated one in
    )
    return launcher, files


def _job(launcher: submit.SubmitLauncher) -> tuple[driver_job.DriverJob, Any]:
    spec = StageSpec(pipeline_key="nyc", stage_id="enrich", splits=("a",), batch_size=1)
    return launcher.build_job(StageJob(spec), StageCode(transform=lambda ctx: None))


def _record(sid: str, **extra: Any) -> dict[str, Any]:
    return {"submission_id": sid, "pipeline_key": "nyc", "stage_id": "enrich",
            "submitted_at": time.time(), **extra}  # fmt: skip


def test_first_try_records_the_submission_in_the_task_state_store(tmp_path: Path) -> None:
    from airflow_finalckpt.spark.launch.resumable import SUBMISSION_STATE_KEY

    submitted: list[str] = []
    launcher, files = _launcher(tmp_path, submitted)
    store = _StateStore()
    recorded_before_submit: list[Any] = []

    class RecordCheckingHook(_Hook):
        def submit(self, application: str) -> None:
            recorded_before_submit.append(store.get(SUBMISSION_STATE_KEY))
            super().submit(application)

    launcher.hook_factory = lambda **kw: RecordCheckingHook(files, submitted, **kw)
    job, code = _job(launcher)
    outcome = launcher.run(job, code, {"task_state_store": store})
    assert submitted == [job.submission_id] and not outcome.reconnected and outcome.epoch == 9
    # the record is in the store before spark-submit starts: no driver no try knows of
    assert recorded_before_submit[0]["submission_id"] == job.submission_id
    record = store.get(SUBMISSION_STATE_KEY)
    assert record["submission_id"] == job.submission_id and record["stage_id"] == "enrich"
    assert launcher.state_store_kind == "airflow" and launcher.resumable.previous is None
    assert not files.exists(None, "current.json")  # the task state store replaces it


@pytest.mark.parametrize(
    ("beat_epoch", "logged"),
    # a heartbeat without an epoch: the driver runs but has not taken the stage yet; the epoch
    # it takes is the newest (nothing was submitted after it), so it is reattached to as well
    [(3, "still runs (epoch 3,"), (None, "still runs (has not taken the stage yet,")],
)
def test_a_later_try_reattaches_to_a_running_driver(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, beat_epoch: int | None, logged: str
) -> None:
    from airflow_finalckpt.spark.launch.resumable import SUBMISSION_STATE_KEY, SubmissionStatus

    submitted: list[str] = []
    launcher, files = _launcher(tmp_path, submitted)
    store = _StateStore()
    store.set(SUBMISSION_STATE_KEY, _record("s1"))
    beat = {"at": time.time(), "epoch": beat_epoch}
    files.write("s1", "heartbeat.json", json.dumps(beat).encode())
    caplog.set_level("INFO", logger=submit.__name__)

    def finish_later() -> None:
        time.sleep(0.5)
        doc = {"result": {"status": "finished", "epoch": 3, "processed_splits": ["a"]}}
        files.write("s1", "result.json", json.dumps(doc).encode())

    threading.Thread(target=finish_later, daemon=True).start()
    job, code = _job(launcher)
    outcome = launcher.run(job, code, {"task_state_store": store})
    assert outcome.reconnected and outcome.epoch == 3 and outcome.submission_id == "s1"
    assert outcome.result.processed_splits == ("a",)
    assert submitted == []  # nothing was submitted
    assert launcher.resumable.previous == {"submission_id": "s1", "status": "RUNNING"}
    assert SubmissionStatus.RUNNING in SubmissionStatus.ACTIVE
    assert logged in caplog.text


@pytest.mark.parametrize(
    ("setup", "status"),
    [
        ("exited", "EXITED"),  # try 1 saw spark-submit end without a result
        ("stale", "LOST"),  # heartbeat older than the stale period
        ("failed", "FAILED"),  # the driver wrote its error
        ("suspended", "ENDED"),  # a stop with savepoint: the resume submits again
        ("foreign", "FOREIGN"),  # a record of another pipeline
    ],
)
def test_a_later_try_resubmits_when_the_recorded_driver_is_gone(
    tmp_path: Path, setup: str, status: str
) -> None:
    from airflow_finalckpt.spark.launch.resumable import SUBMISSION_STATE_KEY

    submitted: list[str] = []
    launcher, files = _launcher(tmp_path, submitted)
    store = _StateStore()
    record = _record("s1", **({"exited_at": time.time()} if setup == "exited" else {}))
    if setup == "foreign":
        record["pipeline_key"] = "other"
    store.set(SUBMISSION_STATE_KEY, record)
    beat_at = time.time() - (60 if setup == "stale" else 0)
    files.write("s1", "heartbeat.json", json.dumps({"at": beat_at, "epoch": 3}).encode())
    if setup == "failed":
        files.write("s1", "result.json", json.dumps({"error": {"type": "X"}}).encode())
    if setup == "suspended":
        doc = {"result": {"status": "suspended", "epoch": 3}}
        files.write("s1", "result.json", json.dumps(doc).encode())
    job, code = _job(launcher)
    outcome = launcher.run(job, code, {"task_state_store": store})
    assert submitted == [job.submission_id] and outcome.epoch == 9 and not outcome.reconnected
    assert launcher.resumable.previous == {"submission_id": "s1", "status": status}
    assert store.get(SUBMISSION_STATE_KEY)["submission_id"] == job.submission_id


def test_a_reattached_driver_that_dies_is_replaced_in_the_same_try(tmp_path: Path) -> None:
    from airflow_finalckpt.spark.launch.resumable import SUBMISSION_STATE_KEY

    submitted: list[str] = []
    launcher, files = _launcher(tmp_path, submitted, stale_s=0.5)
    store = _StateStore()
    store.set(SUBMISSION_STATE_KEY, _record("s1"))
    files.write("s1", "heartbeat.json", json.dumps({"at": time.time(), "epoch": 3}).encode())
    job, code = _job(launcher)
    outcome = launcher.run(job, code, {"task_state_store": store})  # s1 never beats again
    assert submitted == [job.submission_id] and not outcome.reconnected


def test_without_a_task_state_store_the_record_goes_to_the_checkpoint_storage(
    tmp_path: Path,
) -> None:
    from airflow_finalckpt.spark.launch.resumable import SUBMISSION_STATE_KEY

    submitted: list[str] = []
    launcher, files = _launcher(tmp_path, submitted)
    job, code = _job(launcher)
    launcher.run(job, code, {})
    assert launcher.state_store_kind == "checkpoint storage"
    current = files.read_json(None, "current.json")
    assert current is not None
    assert current[SUBMISSION_STATE_KEY]["submission_id"] == job.submission_id
    # a second "try" without a store reads it back from there (EXITED is not recorded:
    # the driver finished, its result is taken, nothing is submitted again)
    again, _ = _job(launcher)
    outcome = launcher.run(again, code, {})
    assert submitted == [job.submission_id] and outcome.reconnected
    assert launcher.resumable.previous["status"] == "FINISHED"


def test_a_killed_driver_is_recorded_exited_for_the_next_try(tmp_path: Path) -> None:
    from airflow_finalckpt.spark.launch.resumable import SUBMISSION_STATE_KEY

    submitted: list[str] = []
    launcher, files = _launcher(tmp_path, submitted)

    class DeadHook(_Hook):
        def submit(self, application: str) -> None:
            raise RuntimeError("spark-submit exited with -9")

    launcher.hook_factory = lambda **kw: DeadHook(files, submitted, **kw)
    store = _StateStore()
    job, code = _job(launcher)
    with pytest.raises(driver_job.DriverError, match="ended without a result"):
        launcher.run(job, code, {"task_state_store": store})
    record = store.get(SUBMISSION_STATE_KEY)
    assert record["submission_id"] == job.submission_id and record["exited_at"] > 0


def test_standalone_cluster_mode_is_a_permanent_error(no_spark_env: pytest.MonkeyPatch) -> None:
    from airflow_finalckpt.core.errors import is_permanent
    from airflow_finalckpt.spark.launch import UnsupportedDeployModeError

    with pytest.raises(UnsupportedDeployModeError) as refused:
        _op(spark_master="spark://m:7077", spark_deploy_mode="cluster")._spark_target()
    assert is_permanent(refused.value)
