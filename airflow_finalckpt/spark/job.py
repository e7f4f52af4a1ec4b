"""What the Airflow task and a submitted Spark driver exchange: Airflow-free, no Spark.

The task (``spark.launch.submit``) writes a ``DriverJob`` into the checkpoint storage and the driver
(``spark.driver``) reads it back, heartbeats and writes its ``RunResult`` beside it::

    drivers/<stage>/<submission>/spec.json           the job spec, sealed (``spark.sealed_spec``)
    drivers/<stage>/<submission>/code.pkl            transform, on_finish and sinks (cloudpickle,
                                                     sealed: ``spark.secrets``)
    drivers/<stage>/<submission>/heartbeat.json      written by the driver every few seconds
    drivers/<stage>/<submission>/result.json         the driver's RunResult (or its error)
    drivers/<stage>/<submission>/cancel              asks a driver to stop (``on_kill``)

The coordination store URL and the storage settings travel in the environment variables named
here, never in the spec file. The spec names code (``ref:module:qualname``) and the splits the
driver runs: it is sealed like ``code.pkl`` and the driver opens it before it imports anything.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import posixpath
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_finalckpt.config import env_var_name
from airflow_finalckpt.core.batching import DEFAULT_TARGET_BATCH_S
from airflow_finalckpt.core.errors import ConfigurationError, FinalCheckpointError
from airflow_finalckpt.core.model import EndOfData
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.runtime.assembly import StageJob
from airflow_finalckpt.runtime.runner import CommitMode, RunResult, RunStatus, StageSpec
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.bounded import driver_file_cap, read_capped

#: 2: batch_size may be "auto", with target_batch_s and hints_scope (and, optional within
#: format 2, ``run_context``: the Airflow run's logical date, interval, params; see
#: ``core.run_context``). 3: the spec file is sealed (``spark.sealed_spec``), the job inside.
JOB_FORMAT = 3
DRIVERS_DIR = "drivers"
HEARTBEAT_INTERVAL_S = 5.0
#: A heartbeat older than this means the driver is gone.
HEARTBEAT_STALE_S = 30.0
STORE_URL_ENV = env_var_name("store_url")
STORAGE_URI_ENV = env_var_name("storage_uri")
STORAGE_OPTIONS_ENV = env_var_name("storage_options")


class DriverError(FinalCheckpointError):
    """The Spark driver failed, or ended without a result."""


class DriverLost(DriverError):
    """A driver this try reattached to stopped heartbeating without a result."""


def driver_script() -> str:
    """The application file ``spark-submit`` runs (in the installed package; not imported)."""
    spec = importlib.util.find_spec("airflow_finalckpt.spark.driver")
    if spec is None or spec.origin is None:
        raise ConfigurationError("airflow_finalckpt.spark.driver is not installed")
    return os.path.abspath(spec.origin)


def resolve_reference(ref: str) -> Any:
    """The object a ``module:qualname`` reference names (imported in this process; a driver
    resolves only what its sealed spec declares: ``spark.sealed_spec.declared_reference``).
    """
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class DriverJob:
    """Everything the driver needs besides the code (JSON; the store URL travels in env)."""

    submission_id: str
    pipeline_key: str
    stage_id: str
    splits: tuple[str, ...]
    batch_size: int | str
    checkpoint_interval_s: float
    commit_mode: str
    upstream_manifests: dict[str, list[str]]
    storage_uri: str
    store_url_masked: str
    target_batch_s: float = DEFAULT_TARGET_BATCH_S
    #: Where measured batch throughput is shared (the DAG); None: not kept.
    hints_scope: str | None = None
    #: The stage's ``split_keys`` (the plan check).
    split_keys: tuple[str, ...] = ()
    code: dict[str, str | None] = field(default_factory=dict)
    spark_conf: dict[str, str] = field(default_factory=dict)
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    attempt_lease_s: float = 60.0
    on_drain: str = "stop"
    allow_split_list_change: bool = False
    #: where the pipeline key came from (``StageSpec.key_origin``)
    key_origin: str = "default"
    #: The Airflow run the stage works for (``RunContext.to_json``): JSON values, no Airflow.
    run_context: dict[str, Any] = field(default_factory=dict)
    format: int = JOB_FORMAT

    @classmethod
    def for_stage(
        cls,
        stage: StageJob,
        *,
        submission_id: str,
        storage_uri: str,
        store_url_masked: str,
        code: Mapping[str, str | None],
        spark_conf: Mapping[str, str],
    ) -> DriverJob:
        """The job spec of one submission of ``stage``."""
        spec = stage.spec
        return cls(
            submission_id=submission_id,
            pipeline_key=spec.pipeline_key,
            stage_id=spec.stage_id,
            splits=tuple(spec.splits),
            batch_size=spec.batch_size,
            split_keys=tuple(spec.split_keys),
            target_batch_s=float(spec.target_batch_s),
            hints_scope=stage.hints_scope,
            checkpoint_interval_s=float(spec.checkpoint_interval_s),
            commit_mode=str(spec.commit_mode),
            upstream_manifests={k: list(v) for k, v in stage.upstream_manifests.items()},
            storage_uri=storage_uri,
            store_url_masked=store_url_masked,
            code=dict(code),
            spark_conf=dict(spark_conf),
            attempt_lease_s=float(spec.attempt_lease_s),
            on_drain=spec.on_drain,
            allow_split_list_change=spec.allow_split_list_change,
            key_origin=spec.key_origin,
            run_context=stage.run.to_json(),
        )

    def stage_job(self) -> StageJob:
        """The plain values the driver assembles its stage runner from."""
        return StageJob(
            spec=StageSpec(
                pipeline_key=self.pipeline_key,
                stage_id=self.stage_id,
                splits=tuple(self.splits),
                batch_size=self.batch_size,
                split_keys=tuple(self.split_keys),
                checkpoint_interval_s=self.checkpoint_interval_s,
                commit_mode=CommitMode(self.commit_mode),
                target_batch_s=self.target_batch_s,
                attempt_lease_s=self.attempt_lease_s,
                on_drain=self.on_drain,
                allow_split_list_change=self.allow_split_list_change,
                key_origin=self.key_origin,
            ),
            upstream_manifests=self.upstream_manifests,
            hints_scope=self.hints_scope,
            run=RunContext.from_json(self.run_context),
        )

    def to_json(self) -> bytes:
        """The job as JSON (sealed into ``spec.json`` by ``spark.sealed_spec.seal_spec``)."""
        doc = dataclasses.asdict(self)
        doc["splits"] = list(self.splits)
        return json.dumps(doc, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> DriverJob:
        """The job of a (verified) spec; refused if another version of the plugin wrote it."""
        doc = json.loads(data)
        if doc.get("format") != JOB_FORMAT:
            raise ConfigurationError(
                f"driver job format {doc.get('format')!r} is not {JOB_FORMAT}: the driver and "
                "the Airflow task run different airflow-finalckpt versions"
            )
        doc["splits"] = tuple(doc["splits"])
        doc["split_keys"] = tuple(doc.get("split_keys", ()))
        return cls(**doc)


def submission_dir(stage_id: str, submission_id: str | None = None) -> str:
    """``drivers/<stage>[/<submission>]``: where one stage's driver files live."""
    return posixpath.join(DRIVERS_DIR, stage_id, *([submission_id] if submission_id else []))


def result_to_json(result: RunResult, **extra: Any) -> bytes:
    """A driver's ``RunResult`` (plus ``extra`` fields) as JSON for ``result.json``."""
    doc: dict[str, Any] = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, EndOfData):
            value = value.model_dump(mode="json")
        elif isinstance(value, RunStatus):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        doc[f.name] = value
    doc.update(extra)
    return json.dumps({"result": doc}, sort_keys=True).encode()


def result_from_doc(doc: Mapping[str, Any]) -> RunResult:
    """The ``RunResult`` of a ``result.json`` document; fields it does not know are ignored."""
    names = {f.name for f in dataclasses.fields(RunResult)}
    kwargs: dict[str, Any] = {}
    for name, value in doc.items():
        if name not in names:
            continue
        if name == "status":
            value = RunStatus(value)
        elif name == "end_of_data" and value is not None:
            value = EndOfData.model_validate(value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return RunResult(**kwargs)


@dataclass(frozen=True)
class DriverOutcome:
    """What the Airflow task learns from the driver."""

    result: RunResult
    epoch: int
    submission_id: str
    reconnected: bool = False
    app_id: str | None = None


def driver_outcome(
    stage_id: str, sid: str, doc: Mapping[str, Any], *, reconnected: bool
) -> DriverOutcome:
    """The outcome a driver's ``result.json`` reports; its error raised as ``DriverError``."""
    error = doc.get("error")
    if error:
        trace = error.get("traceback")  # none for a refusal: its one line says it all
        raise DriverError(
            f"stage {stage_id!r}: the Spark driver (submission {sid}, epoch "
            f"{doc.get('epoch')}) failed: {error.get('type')}: {error.get('message')}"
            + (f"\n{trace}" if trace else "")
        )
    result = result_from_doc(doc["result"])
    epoch = doc["result"].get("epoch")
    if epoch is None:
        raise DriverError(f"stage {stage_id!r}: driver result without an epoch")
    return DriverOutcome(
        result=result,
        epoch=int(epoch),
        submission_id=sid,
        reconnected=reconnected,
        app_id=doc["result"].get("app_id"),
    )


class Files:
    """The driver files of one stage in the checkpoint storage."""

    def __init__(self, storage: CheckpointStorage, pipeline_key: str, stage_id: str) -> None:
        self.storage = storage
        self.pipeline_key = pipeline_key
        self.stage_id = stage_id

    def path(self, submission_id: str | None, name: str) -> str:
        """The path of a driver file relative to the pipeline's directory."""
        return posixpath.join(submission_dir(self.stage_id, submission_id), name)

    def write(self, submission_id: str | None, name: str, data: bytes) -> str:
        """Write a driver file atomically; returns its full URI."""
        rel = self.path(submission_id, name)
        self.storage.write_state(self.pipeline_key, rel, data)
        return self.storage.resolve_handle(self.pipeline_key, rel)

    def read(self, submission_id: str | None, name: str) -> bytes | None:
        """A driver file's bytes, read afresh (not from a listing cache); None if absent."""
        full = self.storage.resolve_handle(self.pipeline_key, self.path(submission_id, name))
        fs = self.storage.fs
        try:
            fs.invalidate_cache(posixpath.dirname(full))
            return read_capped(fs, full, driver_file_cap(name), what="driver file")
        except FileNotFoundError:
            return None

    def read_json(self, submission_id: str | None, name: str) -> dict[str, Any] | None:
        """A driver file as a JSON object; None if absent."""
        data = self.read(submission_id, name)
        return None if data is None else dict(json.loads(data))

    def exists(self, submission_id: str | None, name: str) -> bool:
        """Whether a driver file (such as the ``cancel`` marker) exists."""
        return self.read(submission_id, name) is not None


def heartbeat_age(beat: Mapping[str, Any] | None) -> float | None:
    """Seconds since the driver's last heartbeat; None before its first."""
    if beat is None:
        return None
    return max(0.0, time.time() - float(beat.get("at", 0)))
