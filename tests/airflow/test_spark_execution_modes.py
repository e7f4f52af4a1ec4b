"""Execution mode selection (connection / config / operator args) and the submit wiring of the
stage operator, without a Spark cluster (tests/cluster runs the real thing)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest

from airflow_finalckpt.core.coordinator import Coordinator
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import EndOfData
from airflow_finalckpt.operators.stage import SPARK_SUBMISSION_KEY, FinalCheckpointStageOperator
from airflow_finalckpt.runtime.runner import RunResult, RunStatus
from airflow_finalckpt.spark import submit
from airflow_finalckpt.spark.launch import EXECUTION_ENV, ExecutionMode, resolve_target
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
    assert submit.resolve_reference(ref) is windows_transform


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

    def fake_run(self: submit.SubmitLauncher, job: submit.DriverJob, code: Any) -> Any:
        seen["job"] = job
        seen["target"] = self.target
        eod = EndOfData(manifest=["data/s/x"])
        return submit.DriverOutcome(
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
    assert run.runner.epoch == 7 and run.spark_started
    assert run.result.end_of_data is not None and run.result.end_of_data.manifest == ["data/s/x"]
    assert seen["target"].deploy_mode == "client" and seen["job"].splits == ("a",)
    assert ti.xcoms[SPARK_SUBMISSION_KEY]["epoch"] == 7
