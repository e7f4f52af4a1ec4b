"""Credentials reach a submitted Spark driver through a secrets file only the job can read,
and its code only through a sealed ``code.pkl`` (issue 27): the spark-submit command line the
Spark provider builds, the driver's environment, the spec and the code file hold no password;
a tampered or unsigned code file is refused before unpickling."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.runtime.assembly import StageCode, StageJob
from airflow_finalckpt.runtime.runner import StageSpec
from airflow_finalckpt.sinks import SqlTableSink
from airflow_finalckpt.spark import driver
from airflow_finalckpt.spark import job as driver_job
from airflow_finalckpt.spark.launch import ExecutionMode, SparkTarget, submit
from airflow_finalckpt.spark.sealed_spec import OpenedSpec, code_digest
from airflow_finalckpt.spark.secrets import UntrustedCodeError, code_key
from airflow_finalckpt.storage import CheckpointStorage

PASSWORD = "PlantedPw-7f3a9c"
STORE = f"postgresql+psycopg://finalckpt:{PASSWORD}@db.example:5432/coord"
SINK_URL = f"postgresql+psycopg://writer:{PASSWORD}@warehouse.example:5432/dw"

pytestmark = pytest.mark.usefixtures("airflow_home")


def transform(ctx: Any) -> None:
    return None


class RecordingHook:
    """Stands in for SparkSubmitHook: keeps its arguments and what the driver would see."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.secrets_seen: dict[str, Any] | None = None
        self.secrets_mode: int | None = None

    def submit(self, application: str) -> None:
        args = self.kwargs["application_args"]
        path = args[args.index("--secrets") + 1]
        self.secrets_mode = stat.S_IMODE(os.stat(path).st_mode)
        self.secrets_seen = driver.read_secrets_file(path)  # as the driver reads it

    def on_kill(self) -> None:
        pass


def launcher(tmp_path: Path, master: str, deploy: str, **kwargs: Any) -> submit.SubmitLauncher:
    hooks: list[RecordingHook] = []
    made = submit.SubmitLauncher(
        SparkTarget(ExecutionMode.SUBMIT, master, deploy),
        CheckpointStorage(str(tmp_path / "ckpt")),
        store_url=STORE,
        store_url_masked="postgresql+psycopg://finalckpt:***@db.example:5432/coord",
        hook_factory=lambda **kw: hooks.append(RecordingHook(**kw)) or hooks[-1],
        **kwargs,
    )
    made.hooks = hooks  # type: ignore[attr-defined]
    return made


def job_and_code(made: submit.SubmitLauncher) -> tuple[driver_job.DriverJob, bytes | None]:
    spec = StageSpec(pipeline_key="p", stage_id="s", splits=("a",), batch_size=1)
    sink = SqlTableSink("out", SINK_URL, "rows")
    return made.build_job(StageJob(spec), StageCode(transform=transform, sinks=(sink,)))


def test_client_mode_passes_credentials_in_a_private_file_only(tmp_path: Path) -> None:
    made = launcher(tmp_path, "spark://m:7077", "client", code_signing_key="k-123456")
    job, code = job_and_code(made)
    assert code is not None and PASSWORD.encode() not in code  # sealed: sink URL unreadable
    files = driver_job.Files(made.storage, job.pipeline_key, job.stage_id)
    spec_uri = files.write(job.submission_id, "spec.json", made.seal_spec(job, code))
    hook = made.make_hook(job, spec_uri)
    shown = json.dumps(hook.kwargs, default=str)
    assert PASSWORD not in shown and "postgresql" not in shown, shown
    assert driver_job.STORE_URL_ENV not in hook.kwargs["env_vars"]
    secrets_path = made.secrets_path
    assert secrets_path is not None and os.path.exists(secrets_path)
    assert stat.S_IMODE(os.stat(os.path.dirname(secrets_path)).st_mode) == 0o700
    hook.submit("driver.py")
    assert hook.secrets_mode == 0o600
    assert hook.secrets_seen == {
        "store_url": STORE,
        "code_signing_key": "k-123456",
        "storage_options": None,
    }
    assert not os.path.exists(secrets_path)  # the driver removes it once read
    made.cleanup_secrets()
    assert not os.path.exists(os.path.dirname(secrets_path))


def test_the_spark_provider_command_line_holds_no_credential(tmp_path: Path) -> None:
    """The real SparkSubmitHook's command in YARN cluster mode (where the provider turns
    env_vars into --conf spark.yarn.appMasterEnv.*): no password, no store URL; the secrets
    file is shipped by --files and named by its basename."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    made = submit.SubmitLauncher(
        SparkTarget(ExecutionMode.SUBMIT, "yarn", "cluster"),
        CheckpointStorage(str(tmp_path / "ckpt")),
        store_url=STORE,
        store_url_masked="masked",
        code_signing_key="k-123456",
    )
    job, _code = job_and_code(made)
    hook = made.make_hook(job, str(tmp_path / "spec.json"))
    assert isinstance(hook, SparkSubmitHook)
    command = hook._build_spark_submit_command(driver_job.driver_script())
    shown = " ".join(command)
    assert PASSWORD not in shown and "k-123456" not in shown and "db.example" not in shown
    assert made.secrets_path is not None
    assert command[command.index("--files") + 1] == made.secrets_path
    assert command[command.index("--secrets") + 1] == os.path.basename(made.secrets_path)
    made.cleanup_secrets()


def test_kubernetes_cluster_mode_takes_credentials_from_secret_refs(tmp_path: Path) -> None:
    refs = {
        "spark.kubernetes.driver.secretKeyRef.AIRFLOW__FINALCKPT__STORE_URL": "fc:url",
        "spark.kubernetes.driver.secretKeyRef.AIRFLOW__FINALCKPT__CODE_SIGNING_KEY": "fc:key",
    }
    made = launcher(
        tmp_path, "k8s://https://kube:6443", "cluster", spark_conf=refs, code_signing_key="k-1"
    )
    job, _code = job_and_code(made)
    hook = made.make_hook(job, "spec.json")
    shown = json.dumps(hook.kwargs, default=str)  # env_vars become driverEnv --conf there
    assert PASSWORD not in shown and 'k-1"' not in shown and "--secrets" not in shown
    assert made.secrets_path is None


def test_kubernetes_cluster_mode_without_secret_refs_is_refused(tmp_path: Path) -> None:
    made = launcher(tmp_path, "k8s://https://kube:6443", "cluster", code_signing_key="k-1")
    job, _code = job_and_code(made)
    with pytest.raises(ConfigurationError, match=r"secretKeyRef\.AIRFLOW__FINALCKPT__STORE_URL"):
        made.make_hook(job, "spec.json")


def test_a_tampered_swapped_or_unsigned_code_file_is_refused_before_unpickling(
    tmp_path: Path,
) -> None:
    made = launcher(tmp_path, "spark://m:7077", "client", code_signing_key="k-123456")
    job, code = job_and_code(made)
    assert code is not None
    files = driver_job.Files(made.storage, job.pipeline_key, job.stage_id)
    files.write(job.submission_id, "code.pkl", code)
    loaded = driver._load_code(OpenedSpec(job, code_digest(code)), files, "k-123456")
    assert loaded.sinks[0].sink_id == "out"  # the sealed file opens with the right key

    import pickle

    tampered = bytearray(code)
    tampered[len(tampered) // 2] ^= 1
    unsigned = pickle.dumps({"transform": transform})
    _other_job, swapped = job_and_code(made)  # another submission's sealed code
    assert swapped is not None and swapped != code
    for blob in (bytes(tampered), unsigned, swapped):
        files.write(job.submission_id, "code.pkl", blob)
        with pytest.raises(UntrustedCodeError, match="refused before unpickling") as refused:
            driver._load_code(OpenedSpec(job, code_digest(code)), files, "k-123456")
        assert "\n" not in str(refused.value)
        if blob is not swapped:  # and the seal itself, had the spec named this file
            with pytest.raises(UntrustedCodeError, match="refused before unpickling"):
                driver._load_code(OpenedSpec(job, code_digest(blob)), files, "k-123456")
    files.write(job.submission_id, "code.pkl", code)
    with pytest.raises(UntrustedCodeError):  # sealed with another deployment's key
        driver._load_code(OpenedSpec(job, code_digest(code)), files, "another-key")


def test_a_conn_id_sink_reaches_the_driver_through_the_secrets_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: a sink whose URL comes from an Airflow connection pickles the connection's id
    only; its resolved connection travels in the secrets file and binds the driver's sink."""
    import pickle

    from airflow_finalckpt.hooks.sink_connections import bind_sink_connections
    from airflow_finalckpt.spark.secrets import open_code

    conn = {"conn_type": "postgres", "host": "warehouse.example", "login": "writer"}
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE_DB", json.dumps({**conn, "password": PASSWORD}))
    sink = SqlTableSink("out", table="rows", conn_id="warehouse_db")
    assert bind_sink_connections([sink]) == 1
    made = launcher(tmp_path, "spark://m:7077", "client", code_signing_key="k-123456")
    spec = StageSpec(pipeline_key="p", stage_id="s", splits=("a",), batch_size=1)
    job, code = made.build_job(StageJob(spec), StageCode(transform=transform, sinks=(sink,)))
    assert code is not None
    opened = open_code(code, code_key("k-123456"), "code.pkl")
    assert PASSWORD.encode() not in opened and b"warehouse.example" not in opened
    files = driver_job.Files(made.storage, job.pipeline_key, job.stage_id)
    spec_uri = files.write(job.submission_id, "spec.json", made.seal_spec(job, code))
    hook = made.make_hook(job, spec_uri)
    hook.submit("driver.py")
    assert hook.secrets_seen is not None
    handed = hook.secrets_seen["sink_connections"]["warehouse_db"]
    assert handed["password"] == PASSWORD
    (shipped,) = pickle.loads(opened)["sinks"]
    driver._bind_connections(StageCode(transform=transform, sinks=(shipped,)), hook.secrets_seen)
    assert shipped.engine.url == sink.engine.url
    made.cleanup_secrets()

    k8s = launcher(tmp_path, "k8s://https://kube:6443", "cluster", code_signing_key="k-123456")
    k8s.build_job(StageJob(spec), StageCode(transform=transform, sinks=(sink,)))
    with pytest.raises(ConfigurationError, match=r"secretKeyRef\.AIRFLOW_CONN_WAREHOUSE_DB="):
        k8s.make_hook(job, "spec.json")


def test_a_storage_conn_id_sink_reaches_the_driver_through_the_secrets_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: a Parquet sink's storage connection, resolved by the task, travels in the
    secrets file as ``storage:<id>``; code.pkl holds its id only; a Kubernetes cluster-mode
    driver must get ``AIRFLOW_CONN_<ID>`` from a Secret."""
    import pickle

    from airflow_finalckpt.hooks.sink_connections import bind_sink_connections
    from airflow_finalckpt.sinks import ParquetTableSink
    from airflow_finalckpt.spark.secrets import open_code

    extra = {"storage_options": {"token": PASSWORD}}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_FS", json.dumps({"conn_type": "generic", "extra": extra}))
    sink = ParquetTableSink("files", f"memory://{tmp_path.name}/t", storage_conn_id="lake_fs")
    assert bind_sink_connections([sink]) == 1
    made = launcher(tmp_path, "spark://m:7077", "client", code_signing_key="k-123456")
    spec = StageSpec(pipeline_key="p", stage_id="s", splits=("a",), batch_size=1)
    job, code = made.build_job(StageJob(spec), StageCode(transform=transform, sinks=(sink,)))
    assert code is not None
    opened = open_code(code, code_key("k-123456"), "code.pkl")
    assert PASSWORD.encode() not in opened
    files = driver_job.Files(made.storage, job.pipeline_key, job.stage_id)
    spec_uri = files.write(job.submission_id, "spec.json", made.seal_spec(job, code))
    hook = made.make_hook(job, spec_uri)
    hook.submit("driver.py")
    assert hook.secrets_seen is not None
    assert hook.secrets_seen["sink_connections"]["storage:lake_fs"]["extra"] == extra
    (shipped,) = pickle.loads(opened)["sinks"]
    monkeypatch.delenv("AIRFLOW_CONN_LAKE_FS")
    driver._bind_connections(StageCode(transform=transform, sinks=(shipped,)), hook.secrets_seen)
    assert shipped.storage_options == {"token": PASSWORD}
    made.cleanup_secrets()

    k8s = launcher(tmp_path, "k8s://https://kube:6443", "cluster", code_signing_key="k-123456")
    k8s.build_job(StageJob(spec), StageCode(transform=transform, sinks=(sink,)))
    with pytest.raises(ConfigurationError, match=r"secretKeyRef\.AIRFLOW_CONN_LAKE_FS="):
        k8s.make_hook(job, "spec.json")
