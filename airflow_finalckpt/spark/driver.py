"""The Spark driver side of a stage: runs where Spark runs and never imports Airflow.

``spark_logic`` is the stage logic factory of every Spark execution mode (in the Airflow task,
in-process or Spark Connect, and in a submitted driver). ``spark-submit .../driver.py --job
<spec URI>`` runs ``run_job``: it opens the sealed job spec and the sealed stage code the
Airflow task wrote (``spark.job``, ``spark.sealed_spec``) with the deployment's signing key
before it imports or unpickles anything, assembles the stage runtime (``runtime.assembly``)
against the coordination store and the checkpoint storage, heartbeats while it runs and writes its
``RunResult`` (or its error) as ``result.json`` beside the spec. The coordination store URL, the
code key and credential storage options come from the secrets file ``--secrets`` names (removed
once read; ``spark.secrets``), else from the environment (``AIRFLOW__FINALCKPT__STORE_URL``,
set from a Kubernetes Secret); the storage root from ``..._STORAGE_URI``; never from the spec
file. The signing key comes from the secrets file, else ``AIRFLOW__FINALCKPT__CODE_SIGNING_KEY``
(a Kubernetes Secret), else the key the deployment generated in its coordination store. A spec
or code file that does not verify is refused with one line in ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import posixpath
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if __name__ == "__main__":
    # spark-submit runs this file as a script: its directory must not shadow top-level modules
    # (removed before anything else is imported).
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

from airflow_finalckpt.config import mask_url, parse_storage_options
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import StageDefinitionError
from airflow_finalckpt.runtime.assembly import LogicFactory, StageCode, StageJob, assemble_runner
from airflow_finalckpt.runtime.runner import StageLogic, StageRunner
from airflow_finalckpt.sinks.connections import bind_from_secrets
from airflow_finalckpt.spark.job import (
    STORAGE_OPTIONS_ENV,
    STORAGE_URI_ENV,
    STORE_URL_ENV,
    DriverJob,
    Files,
    result_to_json,
)
from airflow_finalckpt.spark.sealed_spec import (
    OpenedSpec,
    check_code,
    check_location,
    declared_reference,
    open_spec,
)
from airflow_finalckpt.spark.secrets import (
    CODE_KEY_ENV,
    MissingSigningKeyError,
    UntrustedCodeError,
    code_key,
    open_code,
    read_secrets_file,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.bounded import driver_file_cap, read_capped
from airflow_finalckpt.store.deployment_secrets import CODE_SIGNING_KEY, stored_secret
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import auto_migrate_default, require_schema
from airflow_finalckpt.store_password import with_store_password

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from sqlalchemy import Engine

log = logging.getLogger("airflow_finalckpt.driver")


def spark_logic(session: Callable[[], SparkSession]) -> LogicFactory:
    """The stage logic on Spark, its session created on first use (a skipped stage starts
    none): the factory of the operator's in-process path and of a submitted driver.
    """

    def make(job: StageJob, code: StageCode, storage: CheckpointStorage) -> StageLogic:
        # pyspark is imported where Spark runs, not by modules that only name this factory
        from airflow_finalckpt.spark.stage import SparkStageLogic

        if code.transform is None:
            raise StageDefinitionError(f"stage {job.spec.stage_id!r} has no transform")
        return SparkStageLogic(
            session,
            storage,
            job.spec.pipeline_key,
            job.spec.stage_id,
            code.transform,
            on_finish=code.on_finish,
            sinks=code.sinks,
            upstream_manifests={k: list(v) for k, v in job.upstream_manifests.items()},
            split_keys=job.spec.split_keys,
            run=job.run,
            split_bytes=code.split_bytes,
        )

    return make


def _storage_from_env(secrets: dict[str, Any]) -> CheckpointStorage:
    """The checkpoint storage the Airflow task handed over (credentials: in the secrets)."""
    root = os.environ.get(STORAGE_URI_ENV)
    if not root:
        raise SystemExit(
            f"driver: {STORAGE_URI_ENV} is not set; the Airflow task passes it (client mode) or "
            "spark.yarn.appMasterEnv / spark.kubernetes.driverEnv carry it (cluster mode)"
        )
    options = secrets.get("storage_options")
    if options is None:
        options = parse_storage_options(os.environ.get(STORAGE_OPTIONS_ENV, ""))
    return CheckpointStorage(root, options)


class Heartbeat(threading.Thread):
    """Writes ``heartbeat.json`` every few seconds; exits the process on a ``cancel`` marker."""

    def __init__(self, files: Any, sid: str, interval: float) -> None:
        super().__init__(name="finalckpt-heartbeat", daemon=True)
        self.files = files
        self.sid = sid
        self.interval = interval
        #: the stage runner, once assembled: its epoch is the one the driver holds
        self.runner: StageRunner | None = None
        self.app_id: str | None = None
        self.stopped = threading.Event()

    @property
    def epoch(self) -> int | None:
        """The epoch the driver's attempt holds from the moment it took the stage (not from its
        first progress report); None before: the driver runs but has not started its attempt.
        """
        return self.runner.epoch if self.runner is not None else None

    def beat(self) -> None:
        """Write ``heartbeat.json`` now: time, host, pid, epoch and Spark application id."""
        doc = {
            "at": time.time(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "epoch": self.epoch,
            "app_id": self.app_id,
        }
        self.files.write(self.sid, "heartbeat.json", json.dumps(doc).encode())

    def run(self) -> None:
        """Beat every ``interval`` seconds until stopped; exit on a ``cancel`` marker."""
        while not self.stopped.wait(self.interval):
            try:
                if self.files.exists(self.sid, "cancel"):
                    log.error("driver %s: cancelled by the Airflow task (on_kill)", self.sid)
                    os._exit(143)
                self.beat()
            except Exception as exc:  # a storage hiccup must not kill the driver
                log.warning("driver %s: heartbeat failed: %s", self.sid, exc)


def _load_code(opened: OpenedSpec, files: Files, signing_key: str) -> StageCode:
    """The stage's code: references the sealed spec declares, or unpickled from ``code.pkl``
    once it proved to be the file sealed with the spec and its own seal verified (a tampered,
    swapped or unsigned file is refused unread).
    """
    job = opened.job
    sid = job.submission_id
    pickled: dict[str, Any] = {}
    if any(v == "pickle" for v in job.code.values()):
        where = files.path(sid, "code.pkl")
        blob = files.read(sid, "code.pkl")
        if blob is None:
            raise RuntimeError(f"code file {where} is missing")
        check_code(blob, opened, where)
        pickled = pickle.loads(open_code(blob, code_key(signing_key), where))  # sealed by the task

    def load(name: str) -> Any:
        how = job.code.get(name)
        if how is None:
            return None
        if how == "pickle":
            return pickled[name]
        return declared_reference(how, name, files.path(sid, "spec.json"))

    sinks = tuple(load("sinks") or ())
    return StageCode(load("transform"), load("on_finish"), sinks, load("split_bytes"))


def _bind_connections(code: StageCode, secrets: dict[str, Any]) -> StageCode:
    """The ``conn_id`` sinks get their connection from the secrets file (else the driver's
    ``AIRFLOW_CONN_<ID>``): ``code.pkl`` holds connection ids only.
    """
    bind_from_secrets(code.sinks, secrets.get("sink_connections"))
    return code


def _store_url(secrets: dict[str, Any]) -> str:
    """The coordination store from the secrets file (else the environment), or a clear error."""
    store_url = secrets.get("store_url") or os.environ.get(STORE_URL_ENV)
    if store_url:  # Kubernetes: the chart's password-free URL + the password from a Secret
        store_url = with_store_password(store_url)
    if not store_url:
        raise RuntimeError(
            f"the driver got no coordination store: no --secrets file and no {STORE_URL_ENV} "
            "(in Kubernetes cluster mode: from a Secret, spark.kubernetes.driver.secretKeyRef)"
        )
    return str(store_url)


def _check_store(job: DriverJob, store_url: str) -> None:
    """The driver's store must be the Airflow task's."""
    if mask_url(store_url) != job.store_url_masked:
        raise RuntimeError(
            f"the driver's coordination store {mask_url(store_url)} is not the Airflow "
            f"task's {job.store_url_masked}"
        )


def signing_key(secrets: dict[str, Any], engine: Engine) -> str:
    """The deployment's signing key: the secrets file's, the environment's (a Kubernetes
    Secret), else the one the deployment generated in its store.
    """
    key = secrets.get("code_signing_key") or os.environ.get(CODE_KEY_ENV)
    key = key or stored_secret(engine, CODE_SIGNING_KEY)
    if not key:
        raise MissingSigningKeyError(
            f"driver: no code signing key: no --secrets file, no {CODE_KEY_ENV} and none in "
            "the coordination store (the Airflow task generates it there when it seals code)"
        )
    return str(key)


def open_job(storage: CheckpointStorage, job_uri: str, key: str) -> OpenedSpec:
    """The verified job of ``job_uri``: sealed with ``key`` and written in its own directory."""
    sealed = read_capped(storage.fs, job_uri, driver_file_cap("spec.json"), what="driver job spec")
    opened = open_spec(sealed, key, job_uri)
    job = opened.job
    own = Files(storage, job.pipeline_key, job.stage_id).path(job.submission_id, "spec.json")
    strip = storage.fs._strip_protocol
    check_location(strip(storage.resolve_handle(job.pipeline_key, own)), strip(job_uri))
    return opened


def _error_doc(exc: BaseException, epoch: int | None) -> bytes:
    """``result.json`` of a failed driver; a refusal is its one line, without a traceback."""
    error = {"type": type(exc).__name__, "message": str(exc)}
    if not isinstance(exc, UntrustedCodeError | MissingSigningKeyError):
        error["traceback"] = traceback.format_exc(limit=20)
    return json.dumps({"error": error, "epoch": epoch}).encode()


def _refuse(storage: CheckpointStorage, job_uri: str, exc: BaseException) -> int:
    """Report a driver that could not open its job in ``result.json`` beside the spec."""
    result = posixpath.join(posixpath.dirname(job_uri.rstrip("/")), "result.json")
    try:
        storage.fs.pipe_file(result, _error_doc(exc, None))
    finally:
        log.error("driver refused its job %s: %s: %s", job_uri, type(exc).__name__, exc)
    return 1


def open_driver_store(store_url: str) -> Engine:
    """The store's engine, its schema checked: a driver never migrates a shared (PostgreSQL)
    store, whatever ``[finalckpt] auto_migrate`` says; a SQLite one is the machine's own.
    """
    engine = make_engine(store_url)
    try:
        require_schema(engine, auto_migrate=auto_migrate_default(engine))
    except BaseException:
        engine.dispose()
        raise
    return engine


def run_job(job_uri: str, secrets_file: str | None = None) -> int:
    """Run the submitted stage attempt; 0 with its result, 1 with its error in result.json."""
    secrets = read_secrets_file(secrets_file)
    storage = _storage_from_env(secrets)
    engine: Engine | None = None
    try:  # nothing of the job is used before its seal verified
        store_url = _store_url(secrets)
        engine = open_driver_store(store_url)
        key = signing_key(secrets, engine)
        opened = open_job(storage, job_uri, key)
        _check_store(opened.job, store_url)
    except BaseException as exc:
        if engine is not None:
            engine.dispose()
        return _refuse(storage, job_uri, exc)
    return _run_opened(opened, storage, engine, key, secrets)


def _run_opened(
    opened: OpenedSpec,
    storage: CheckpointStorage,
    engine: Engine,
    key: str,
    secrets: dict[str, Any],
) -> int:
    """Run the verified job: heartbeat, load its code, run its stage, write ``result.json``."""
    job = opened.job
    files = Files(storage, job.pipeline_key, job.stage_id)
    sid = job.submission_id
    heartbeat = Heartbeat(files, sid, job.heartbeat_interval_s)
    heartbeat.beat()
    heartbeat.start()
    runner: StageRunner | None = None
    try:
        code = _bind_connections(_load_code(opened, files, key), secrets)

        def session() -> SparkSession:
            from pyspark.sql import SparkSession

            spark = SparkSession.builder.getOrCreate()
            try:
                heartbeat.app_id = spark.sparkContext.applicationId
            except Exception:
                heartbeat.app_id = None
            return spark

        coordinator = Coordinator(engine, job.pipeline_key, writer=storage)
        runner = assemble_runner(
            coordinator,
            storage,
            job.stage_job(),
            code,
            spark_logic(session),
            log=log,
        )
        heartbeat.runner = runner
        log.info(
            "driver %s: stage %s of pipeline %s, %d splits, store %s, storage %s",
            sid,
            job.stage_id,
            job.pipeline_key,
            len(job.splits),
            mask_url(str(engine.url)),
            storage.root_uri,
        )
        result = runner.run()
        files.write(
            sid,
            "result.json",
            result_to_json(
                result,
                epoch=runner.epoch,
                app_id=heartbeat.app_id,
                spark_started=bool(getattr(runner.logic, "spark_started", False)),
            ),
        )
        log.info("driver %s: stage %s %s", sid, job.stage_id, result.status.value)
        return 0
    except BaseException as exc:
        try:
            files.write(sid, "result.json", _error_doc(exc, runner.epoch if runner else None))
        finally:
            log.error("driver %s failed: %s: %s", sid, type(exc).__name__, exc)
        return 1
    finally:
        heartbeat.stopped.set()


def main(argv: list[str] | None = None) -> int:
    """The submitted driver's entry point: run the stage of ``--job`` and write its result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, help="URI of the job spec (spec.json)")
    parser.add_argument("--secrets", default=None, help="path or name of the secrets file")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s finalckpt-driver %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    code = run_job(args.job, args.secrets)
    try:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    except Exception:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
