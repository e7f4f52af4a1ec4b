"""What a Spark driver reads back from the checkpoint storage to decide what code to run is
sealed by the Airflow task (issue 37): a watcher who can write the checkpoint storage (a
shared bucket) can neither rewrite a live run's ``spec.json`` (a ``ref:os:system`` plus an
injected split ran a command as the driver before) nor forge ``code.pkl`` with the key that
used to be derived from the store URL; the run fails with one line and nothing runs. The
first test submits through a real ``spark-submit``; the others run the real driver
(``spark.driver.run_job``) in this process, as the other submit-mode tests do.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.config import mask_url
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.runtime.assembly import StageCode, StageJob
from airflow_finalckpt.runtime.runner import StageSpec
from airflow_finalckpt.spark import driver
from airflow_finalckpt.spark.job import (
    STORAGE_OPTIONS_ENV,
    STORAGE_URI_ENV,
    STORE_URL_ENV,
    DriverError,
)
from airflow_finalckpt.spark.launch import ExecutionMode, SparkTarget
from airflow_finalckpt.spark.launch.submit import SubmitLauncher
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

pytestmark = pytest.mark.usefixtures("airflow_home")

KEY, STAGE = "sealed", "ingest"
#: where the driver imports this module (by its top-level name, as pytest does) from
HERE = str(Path(__file__).resolve().parent)


def count_rows(ctx: Any) -> Any:
    return ctx.spark.createDataFrame([(s,) for s in ctx.splits], "split string")


def driver_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, CheckpointStorage, Coordinator]:
    """A one-stage pipeline in a SQLite store, with the environment a submitted driver reads."""
    url = f"sqlite:///{tmp_path}/store.db"
    engine = make_engine(url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "ckpt"))
    coordinator = Coordinator(engine, KEY, writer=storage)
    coordinator.register(StageGraph.from_edges([STAGE], []))
    monkeypatch.setenv(STORE_URL_ENV, url)
    monkeypatch.setenv(STORAGE_URI_ENV, storage.root_uri)
    monkeypatch.delenv(STORAGE_OPTIONS_ENV, raising=False)
    # the driver imports this module's functions by reference
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, *([path] if path else [])]))
    return url, storage, coordinator


class Watcher(threading.Thread):
    """Someone who can write the checkpoint storage: rewrites the first ``spec.json`` of the
    stage as soon as the task wrote it (before the submitted driver, a JVM away, reads it).
    """

    def __init__(self, root: Path, forged: bytes) -> None:
        super().__init__(daemon=True)
        self.root, self.forged = root, forged
        self.rewritten: Path | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.rewritten is None:
            for spec in self.root.glob(f"**/drivers/{STAGE}/*/spec.json"):
                spec.write_bytes(self.forged)
                self.rewritten = spec
            time.sleep(0.005)


def test_a_live_spec_rewrite_to_os_system_is_refused_before_anything_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real spark-submit (local[1], client mode) of a stage whose spec a watcher rewrites to
    ``split_bytes = ref:os:system`` with the split ``touch <marker>``: before the fix the
    driver imported os.system, ran the split as a command and the run succeeded."""
    url, storage, coordinator = driver_store(tmp_path, monkeypatch)
    marker = tmp_path / "marker-of-the-injected-command"
    launcher = SubmitLauncher(
        SparkTarget(ExecutionMode.SUBMIT, "local[1]", "client"),
        storage,
        store_url=url,
        store_url_masked=mask_url(url),
        spark_conf={"spark.pyspark.python": sys.executable},
        poll_interval_s=0.1,
    )
    spec = StageSpec(pipeline_key=KEY, stage_id=STAGE, splits=("a",))
    job, code = launcher.build_job(StageJob(spec), StageCode(transform=count_rows))
    forged = json.loads(job.to_json())  # the job as the watcher would write it: plain JSON
    forged["code"]["split_bytes"] = "ref:os:system"
    forged["splits"].append(f"touch {marker}")
    watcher = Watcher(tmp_path / "ckpt", json.dumps(forged).encode())
    watcher.start()
    try:
        with pytest.raises(DriverError) as failed:
            launcher.run(job, code, {})
    finally:
        watcher.stop.set()
    assert watcher.rewritten is not None, "the watcher never saw the spec"
    assert not marker.exists(), "the injected command ran"
    message = str(failed.value)
    assert "\n" not in message, message
    assert "UntrustedCodeError: job spec" in message, message
    assert message.endswith("refused before anything is imported"), message
    assert coordinator.stage(STAGE).epoch == 0  # the driver never took the stage


class InProcessDriver:
    """A SparkSubmitHook stand-in: lets ``tamper`` change the driver files the task wrote,
    then runs the real driver on them in this process."""

    tamper: Any = None

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def submit(self, application: str) -> None:
        args = self.kwargs["application_args"]
        spec_uri = args[1]
        type(self).tamper(Path(spec_uri).parent)
        secrets = args[args.index("--secrets") + 1] if "--secrets" in args else None
        if driver.run_job(spec_uri, secrets) != 0:
            raise RuntimeError("the driver wrote an error")

    def on_kill(self) -> None:
        pass


class Touch:
    """Unpickling it creates ``path``: what a forged code.pkl would run."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def old_derived_key(store_url: str) -> bytes:
    """The key code.pkl was sealed with before issue 37 when code_signing_key was unset."""
    digest = hashlib.sha256(b"airflow-finalckpt code.pkl v1\0" + f"store:{store_url}".encode())
    return base64.urlsafe_b64encode(digest.digest())


def in_process_launcher(url: str, storage: CheckpointStorage, tamper: Any) -> SubmitLauncher:
    hook = type("TamperingDriver", (InProcessDriver,), {"tamper": staticmethod(tamper)})
    return SubmitLauncher(
        SparkTarget(ExecutionMode.SUBMIT, "spark://m:7077", "client"),
        storage,
        store_url=url,
        store_url_masked=mask_url(url),
        poll_interval_s=0.05,
        hook_factory=hook,
    )


def test_a_code_file_forged_with_the_old_derivable_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No code_signing_key: before the fix the key was a hash of a constant and the store URL,
    so anyone who knew the URL could seal code the driver unpickled."""
    from cryptography.fernet import Fernet

    url, storage, coordinator = driver_store(tmp_path, monkeypatch)
    marker = tmp_path / "marker-of-the-forged-code"
    forged = Fernet(old_derived_key(url)).encrypt(pickle.dumps({"transform": Touch(marker)}))

    def forge(directory: Path) -> None:
        (directory / "code.pkl").write_bytes(forged)

    launcher = in_process_launcher(url, storage, forge)
    spec = StageSpec(pipeline_key=KEY, stage_id=STAGE, splits=("a",), batch_size=1)
    job, code = launcher.build_job(StageJob(spec), StageCode(transform=lambda ctx: None))
    assert job.code["transform"] == "pickle" and code is not None
    with pytest.raises(DriverError) as failed:
        launcher.run(job, code, {})
    assert not marker.exists(), "the forged code was unpickled"
    message = str(failed.value)
    assert "\n" not in message and message.endswith("refused before unpickling"), message
    assert coordinator.stage(STAGE).epoch == 0


def test_a_tampered_or_copied_sealed_spec_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher keeps the seal: one flipped character, or another submission's sealed spec
    copied over this one (a valid seal, sealed for another directory)."""
    url, storage, _ = driver_store(tmp_path, monkeypatch)
    spec = StageSpec(pipeline_key=KEY, stage_id=STAGE, splits=("a",), batch_size=1)
    other_launcher = in_process_launcher(url, storage, lambda d: None)
    other, other_code = other_launcher.build_job(StageJob(spec), StageCode(transform=count_rows))
    other_spec = other_launcher.seal_spec(other, other_code)

    def flip(directory: Path) -> None:
        sealed = json.loads((directory / "spec.json").read_bytes())
        token = sealed["sealed"]
        middle = len(token) // 2
        sealed["sealed"] = (
            token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1 :]
        )
        (directory / "spec.json").write_text(json.dumps(sealed))

    def copy(directory: Path) -> None:
        (directory / "spec.json").write_bytes(other_spec)

    for tamper, why in ((flip, "tampered"), (copy, "it was sealed for ")):
        launcher = in_process_launcher(url, storage, tamper)
        job, code = launcher.build_job(StageJob(spec), StageCode(transform=count_rows))
        with pytest.raises(DriverError, match="refused before anything is imported") as failed:
            launcher.run(job, code, {})
        assert why in str(failed.value) and "\n" not in str(failed.value)
