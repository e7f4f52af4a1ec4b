"""The Spark driver side of a stage: runs where Spark runs and never imports Airflow.

``spark_logic`` is the stage logic factory of every Spark execution mode (in the Airflow task,
in-process or Spark Connect, and in a submitted driver). ``spark-submit .../driver.py --job
<spec URI>`` runs ``run_job``: it reads the job spec and the stage code the Airflow task wrote
(see ``spark.job``), assembles the stage runtime (``runtime.assembly``) against the
coordination store and the checkpoint storage, heartbeats while it runs and writes its
``RunResult`` (or its error) as ``result.json`` beside the spec. The coordination store URL, the
code key and credential storage options come from the secrets file ``--secrets`` names (removed
once read; ``spark.secrets``), else from the environment (``AIRFLOW__FINALCKPT__STORE_URL``,
set from a Kubernetes Secret); the storage root from ``..._STORAGE_URI``; never from the spec
file. ``code.pkl`` is unpickled only after its seal verified.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
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
    resolve_reference,
    result_to_json,
)
from airflow_finalckpt.spark.secrets import CODE_KEY_ENV, code_key, open_code, read_secrets_file
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.bounded import driver_file_cap, read_capped
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


def _load_code(job: DriverJob, files: Files, key: bytes) -> StageCode:
    """The stage's code: by ``module:qualname`` reference, or unpickled from ``code.pkl``
    once its seal verified with ``key`` (a tampered or unsigned file is refused unread).
    """
    sid = job.submission_id
    pickled: dict[str, Any] = {}
    if any(v == "pickle" for v in job.code.values()):
        where = files.path(sid, "code.pkl")
        blob = files.read(sid, "code.pkl")
        if blob is None:
            raise RuntimeError(f"code file {where} is missing")
        pickled = pickle.loads(open_code(blob, key, where))  # sealed by the Airflow task

    def load(name: str) -> Any:
        how = job.code.get(name)
        if how is None:
            return None
        if how == "pickle":
            return pickled[name]
        return resolve_reference(how[len("ref:") :])

    sinks = tuple(load("sinks") or ())
    return StageCode(load("transform"), load("on_finish"), sinks, load("split_bytes"))


def _bind_connections(code: StageCode, secrets: dict[str, Any]) -> StageCode:
    """The ``conn_id`` sinks get their connection from the secrets file (else the driver's
    ``AIRFLOW_CONN_<ID>``): ``code.pkl`` holds connection ids only.
    """
    bind_from_secrets(code.sinks, secrets.get("sink_connections"))
    return code


def _store_url(job: DriverJob, secrets: dict[str, Any]) -> str:
    """The coordination store from the secrets file (else the environment): the Airflow
    task's, or a clear error.
    """
    store_url = secrets.get("store_url") or os.environ.get(STORE_URL_ENV)
    if store_url:  # Kubernetes: the chart's password-free URL + the password from a Secret
        store_url = with_store_password(store_url)
    if not store_url:
        raise RuntimeError(
            f"the driver got no coordination store: no --secrets file and no {STORE_URL_ENV} "
            "(in Kubernetes cluster mode: from a Secret, spark.kubernetes.driver.secretKeyRef)"
        )
    if mask_url(store_url) != job.store_url_masked:
        raise RuntimeError(
            f"the driver's coordination store {mask_url(store_url)} is not the Airflow "
            f"task's {job.store_url_masked}"
        )
    return store_url


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
    fs = storage.fs
    spec = read_capped(fs, job_uri, driver_file_cap("spec.json"), what="driver job spec")
    job = DriverJob.from_json(spec)
    files = Files(storage, job.pipeline_key, job.stage_id)
    sid = job.submission_id
    heartbeat = Heartbeat(files, sid, job.heartbeat_interval_s)
    heartbeat.beat()
    heartbeat.start()
    runner: StageRunner | None = None
    try:
        store_url = _store_url(job, secrets)
        signing_key = secrets.get("code_signing_key") or os.environ.get(CODE_KEY_ENV)
        code = _bind_connections(_load_code(job, files, code_key(signing_key, store_url)), secrets)

        def session() -> SparkSession:
            from pyspark.sql import SparkSession

            spark = SparkSession.builder.getOrCreate()
            try:
                heartbeat.app_id = spark.sparkContext.applicationId
            except Exception:
                heartbeat.app_id = None
            return spark

        engine = open_driver_store(store_url)
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
            mask_url(store_url),
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
        doc = {
            "error": {
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(limit=20),
            },
            "epoch": runner.epoch if runner is not None else None,
        }
        try:
            files.write(sid, "result.json", json.dumps(doc).encode())
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
