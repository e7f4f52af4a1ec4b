"""A submitted stage driver as an Airflow 3.3 resumable job (``airflow.sdk.ResumableJobMixin``).

The stage operator's spark-submit path runs ``ResumableSubmission.execute_resumable``: the first
try persists a *submission record* (submission id, pipeline, stage, master, deploy mode, host,
pid) in Airflow's task state store and starts ``spark-submit``; a later try of the same task
instance reads the record back and asks the driver files in the checkpoint storage how that
driver is doing (``get_job_status``): still active -> reattach and wait for its result;
finished -> take its result; anything else -> submit afresh. The new driver takes a new epoch,
so a stale driver that comes back is fenced off by the coordinator.

What the task state store cannot do, and stays in the checkpoint storage: the driver's
``heartbeat.json`` (a client-mode driver runs beside the Airflow task and is tracked by no
cluster manager: only the driver can say it still runs, and the task state store is written by
the task, not the driver), ``result.json`` (the driver's ``RunResult``: it is written by the
driver, possibly on another machine without Airflow) and the ``cancel`` marker (``on_kill``
must reach a driver the task only reattached to). Without a task state store in the context
(the operator's ``execute`` called with a hand-made context), the record goes to
``drivers/<stage>/current.json`` in the checkpoint storage instead (``StorageStateStore``).

Airflow is imported here, never by the driver (``airflow_finalckpt.spark.driver``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from airflow.sdk import ResumableJobMixin

from airflow_finalckpt.runtime.runner import RunStatus
from airflow_finalckpt.spark.job import (
    DriverError,
    DriverJob,
    DriverLost,
    DriverOutcome,
    Files,
    driver_outcome,
    driver_script,
    heartbeat_age,
)
from airflow_finalckpt.spark.launch import SparkTarget
from airflow_finalckpt.storage import CheckpointStorage

#: Task state store key of the stage's latest submission (renaming it breaks in-flight retries).
SUBMISSION_STATE_KEY = "finalckpt_spark_submission"


class Launcher(Protocol):
    """What a resumable submission uses of its launcher (``spark.launch.submit.SubmitLauncher``)."""

    target: SparkTarget
    storage: CheckpointStorage
    log: Any
    heartbeat_stale_s: float
    poll_interval_s: float
    #: the hook that runs spark-submit (``on_kill`` stops it)
    hook: Any
    #: the submission this try submitted or reattached to (``on_kill`` cancels it)
    submission: str | None
    #: set by ``on_kill``: stop waiting for a reattached driver
    killed: bool

    def make_hook(self, job: DriverJob, spec_uri: str) -> Any:
        """The SparkSubmitHook that submits ``job`` (its spec at ``spec_uri``)."""
        ...

    def cleanup_secrets(self) -> None:
        """Remove the driver's secrets file once spark-submit ended."""
        ...

    def seal_spec(self, job: DriverJob, code: bytes | None) -> bytes:
        """``spec.json``'s bytes: ``job`` sealed with the deployment's key, bound to ``code``."""
        ...


class SubmissionStatus:
    """The status of a recorded submission (``ResumableJobMixin.get_job_status``)."""

    #: spark-submit started, the driver has not heartbeaten yet (JVM start, cluster queue)
    SUBMITTED = "SUBMITTED"
    #: the driver heartbeats and has no result yet; with or without an epoch in its heartbeat
    #: (none: it has not taken the stage yet; the epoch it takes is the newest, nothing else was
    #: submitted since, so reattaching is as right as for SUBMITTED)
    RUNNING = "RUNNING"
    #: result.json with a finished RunResult
    FINISHED = "FINISHED"
    #: result.json with another status (suspended at a savepoint): submit again to go on
    ENDED = "ENDED"
    #: result.json with the driver's error
    FAILED = "FAILED"
    #: the try that submitted it saw spark-submit end without a result (driver killed)
    EXITED = "EXITED"
    #: no result and no heartbeat for HEARTBEAT_STALE_S: the driver is gone
    LOST = "LOST"
    #: the record names another pipeline or stage (a restore into the same task)
    FOREIGN = "FOREIGN"

    ACTIVE = frozenset({SUBMITTED, RUNNING})


class StorageStateStore:
    """Fallback for ``context["task_state_store"]`` when the Task SDK gives none (the operator's
    ``execute`` called without a task runner): the record lives in the checkpoint storage as
    ``drivers/<stage>/current.json``, keyed like the task state store.
    """

    kind = "checkpoint storage (drivers/<stage>/current.json)"

    def __init__(self, files: Files) -> None:
        self.files = files

    def get(self, key: str, default: Any = None) -> Any:
        """A value of the stage's record, as the Task SDK's state store would return it."""
        doc = self.files.read_json(None, "current.json")
        return default if doc is None else doc.get(key, default)

    def set(self, key: str, value: Any, **_kw: Any) -> None:
        """Store a value in the stage's record (one atomic file write)."""
        doc = self.files.read_json(None, "current.json") or {}
        doc[key] = value
        self.files.write(None, "current.json", json.dumps(doc, sort_keys=True).encode())


class _KeywordLog:
    """``ResumableJobMixin`` logs structlog-style (keyword arguments); stdlib loggers do not."""

    def __init__(self, log: Any) -> None:
        self._log = log

    def _emit(self, level: str, msg: str, *args: Any, **kw: Any) -> None:
        if kw:
            msg = msg + " " + " ".join(f"{k}={v!r}" for k, v in kw.items())
        getattr(self._log, level)(msg, *args)

    def debug(self, msg: str, *args: Any, **kw: Any) -> None:
        self._emit("debug", msg, *args, **kw)

    def info(self, msg: str, *args: Any, **kw: Any) -> None:
        self._emit("info", msg, *args, **kw)

    def warning(self, msg: str, *args: Any, **kw: Any) -> None:
        self._emit("warning", msg, *args, **kw)

    def error(self, msg: str, *args: Any, **kw: Any) -> None:
        self._emit("error", msg, *args, **kw)


class ResumableSubmission(ResumableJobMixin):
    """One stage attempt's driver as an Airflow 3.3 resumable job.

    ``execute_resumable`` (the mixin) reads the submission record a previous try of this task
    left in the task state store: a driver still active (``SUBMITTED``/``RUNNING``) is
    reattached to, a ``FINISHED`` one returns its result, anything else (``EXITED``, ``LOST``,
    ``FAILED``, ``ENDED``, ``FOREIGN``) is submitted afresh. Whether a driver is alive comes from
    its ``result.json`` and ``heartbeat.json`` in the checkpoint storage: a client-mode driver
    is not tracked by any cluster manager, so only the driver itself can say it still runs.
    """

    external_id_key = SUBMISSION_STATE_KEY

    def __init__(
        self, launcher: Launcher, job: DriverJob, code: bytes | None, *, durable: bool = True
    ) -> None:
        # ResumableJobMixin.__init__ is an operator constructor (default_args): not called.
        self.launcher = launcher
        self.job = job
        self.code = code
        self.durable = durable
        self.log = _KeywordLog(launcher.log)  # type: ignore[assignment]
        self.files = Files(launcher.storage, job.pipeline_key, job.stage_id)
        #: what the mixin decided from the previous record (for the XCom and the tests)
        self.previous: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None
        self._submit_error: BaseException | None = None
        self._submitted: str | None = None

    # -- ResumableJobMixin -----------------------------------------------------------------

    def submit_job(self, context: Any) -> Any:
        """Write spec and code, persist the record, start spark-submit; return the record.

        The record is persisted *before* spark-submit starts (the mixin persists it again after
        this returns): no window in which a driver runs that no try knows of. spark-submit runs
        in a thread because in client mode it only returns when the driver ends.
        """
        job, files = self.job, self.files
        sid = job.submission_id
        if self.code is not None:
            files.write(sid, "code.pkl", self.code)
        spec_uri = files.write(sid, "spec.json", self.launcher.seal_spec(job, self.code))
        record = {
            "submission_id": sid,
            "pipeline_key": job.pipeline_key,
            "stage_id": job.stage_id,
            "submitted_at": time.time(),
            "master": self.launcher.target.master,
            "deploy_mode": self.launcher.target.deploy_mode,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        store = context.get("task_state_store")
        if store is not None and self.durable:
            store.set(self.external_id_key, record)
        self._submitted = sid
        self.launcher.submission = sid
        self.log.info(
            "stage %s: spark-submit of submission %s (%s), job %s",
            job.stage_id,
            sid,
            self.launcher.target.describe(),
            spec_uri,
        )
        hook = self.launcher.make_hook(job, spec_uri)
        self.launcher.hook = hook

        def submit() -> None:
            try:
                hook.submit(application=driver_script())
            except BaseException as exc:  # the result file tells more than the exit code
                self._submit_error = exc
            finally:
                self.launcher.cleanup_secrets()

        self._thread = threading.Thread(target=submit, name=f"spark-submit-{sid}", daemon=True)
        self._thread.start()
        return record

    def get_job_status(self, external_id: Any, context: Any) -> str:
        """The recorded submission's status from its driver files; remembered for ``on_kill``."""
        record = dict(external_id) if isinstance(external_id, Mapping) else {}
        status = self._status(record)
        self.previous = {"submission_id": record.get("submission_id"), "status": status}
        return status

    def _status(self, record: Mapping[str, Any]) -> str:
        sid = record.get("submission_id")
        if (
            not sid
            or record.get("pipeline_key") != self.job.pipeline_key
            or record.get("stage_id") != self.job.stage_id
        ):
            return SubmissionStatus.FOREIGN
        doc = self.files.read_json(str(sid), "result.json")
        if doc is not None:
            if doc.get("error"):
                return SubmissionStatus.FAILED
            status = (doc.get("result") or {}).get("status")
            finished = status == RunStatus.FINISHED.value
            return SubmissionStatus.FINISHED if finished else SubmissionStatus.ENDED
        if record.get("exited_at"):
            return SubmissionStatus.EXITED
        stale = self.launcher.heartbeat_stale_s
        age = heartbeat_age(self.files.read_json(str(sid), "heartbeat.json"))
        if age is None:
            # not started yet (a JVM start, or queued on the cluster) or never will: give it
            # the stale period from its submission before giving up on it
            submitted_age = time.time() - float(record.get("submitted_at", 0))
            return SubmissionStatus.SUBMITTED if submitted_age < stale else SubmissionStatus.LOST
        return SubmissionStatus.RUNNING if age < stale else SubmissionStatus.LOST

    def is_job_active(self, status: str) -> bool:
        """Whether the driver may still be working (submitted, or beating recently)."""
        return status in SubmissionStatus.ACTIVE

    def is_job_succeeded(self, status: str) -> bool:
        """Whether the driver wrote a result."""
        return status == SubmissionStatus.FINISHED

    def poll_until_complete(self, external_id: Any, context: Any) -> Any:
        """Wait for the driver's result; return it too: on a reattach ``execute_resumable``
        returns what this returns (it calls ``get_job_result`` only after a fresh submit).
        """
        record = dict(external_id)
        sid = str(record["submission_id"])
        if sid == self._submitted and self._thread is not None:
            self._wait_own_driver(record, context)
        else:
            self._wait_reattached(sid)
        return self.get_job_result(external_id, context)

    def get_job_result(self, external_id: Any, context: Any) -> DriverOutcome:
        """The driver's result; a clear DriverError if it ended without one."""
        sid = str(dict(external_id)["submission_id"])
        doc = self.files.read_json(sid, "result.json")
        if doc is None:
            raise DriverError(
                f"stage {self.job.stage_id!r}: submission {sid} has no result "
                f"({self.files.path(sid, 'result.json')})"
            )
        return driver_outcome(self.job.stage_id, sid, doc, reconnected=sid != self._submitted)

    # -- waiting ---------------------------------------------------------------------------

    def _wait_own_driver(self, record: dict[str, Any], context: Any) -> None:
        assert self._thread is not None
        self._thread.join()
        sid = str(record["submission_id"])
        if self.files.exists(sid, "result.json"):
            return
        # spark-submit ended and the driver wrote nothing: it was killed (or never started).
        # Recorded, so that the next try resubmits at once instead of waiting for the
        # heartbeat to go stale.
        store = context.get("task_state_store")
        if store is not None and self.durable:
            store.set(self.external_id_key, {**record, "exited_at": time.time()})
        failure = self._submit_error
        raise DriverError(
            f"stage {self.job.stage_id!r}: the Spark driver of submission {sid} ended without a "
            f"result ({self.files.path(sid, 'result.json')}): "
            f"{failure or 'spark-submit returned 0'}"
        ) from failure

    def _wait_reattached(self, sid: str) -> None:
        files = self.files
        beat = files.read_json(sid, "heartbeat.json") or {}
        epoch = beat.get("epoch")
        self.log.info(
            "stage %s: driver of submission %s still runs (%s, app %s, host %s, pid %s): "
            "reattaching to it instead of submitting again",
            files.stage_id,
            sid,
            "has not taken the stage yet" if epoch is None else f"epoch {epoch}",
            beat.get("app_id"),
            beat.get("host"),
            beat.get("pid"),
        )
        self.launcher.submission = sid
        started = time.time()
        while True:
            if self.launcher.killed:
                raise DriverError(f"stage {files.stage_id!r}: killed while waiting for driver")
            if files.exists(sid, "result.json"):
                return
            age = heartbeat_age(files.read_json(sid, "heartbeat.json"))
            if age is None:
                age = time.time() - started
            if age >= self.launcher.heartbeat_stale_s:
                raise DriverLost(
                    f"stage {files.stage_id!r}: driver of submission {sid} stopped heartbeating "
                    f"({age:.0f}s ago) without a result"
                )
            time.sleep(self.launcher.poll_interval_s)
