"""Run a stage through ``spark-submit``: the Spark driver runs the stage runtime.

The Airflow task writes a *job* for the driver into the checkpoint storage (a shared location:
in cluster deploy mode the driver runs on another machine), under the pipeline directory::

    drivers/<stage>/<submission>/spec.json           the job spec (JSON: data, never code)
    drivers/<stage>/<submission>/code.pkl            transform, on_finish and sinks (cloudpickle)
    drivers/<stage>/<submission>/heartbeat.json      written by the driver every few seconds
    drivers/<stage>/<submission>/result.json         the driver's RunResult (or its error)
    drivers/<stage>/<submission>/cancel              asks a driver to stop (``on_kill``)

then submits ``airflow_finalckpt/spark/driver.py`` through the Spark provider's
``SparkSubmitHook`` and, when the driver ends, reads ``result.json``. The coordination store
URL and the storage settings go to the driver as environment variables (the hook turns them
into ``spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` in cluster mode), never
into the spec file.

Reattaching across task tries is ``airflow.sdk.ResumableJobMixin`` with Airflow's task state
store (``spark.resumable``): the submission record is kept under ``finalckpt_spark_submission``
(``drivers/<stage>/current.json`` only when the context has no task state store). A later try
reattaches to a driver that still heartbeats and has no result, and submits a new one when the
recorded driver ended without a result (killed), failed, was suspended or stopped
heartbeating; the new driver's attempt takes a new epoch, so a stale driver that comes back is
fenced off by the coordinator.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import posixpath
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_finalckpt.config import env_var_name
from airflow_finalckpt.core.batching import DEFAULT_TARGET_BATCH_S
from airflow_finalckpt.core.errors import ConfigurationError, FinalCheckpointError
from airflow_finalckpt.core.model import EndOfData
from airflow_finalckpt.runtime.runner import RunResult, RunStatus
from airflow_finalckpt.spark.launch import (
    STANDALONE_PYTHON_CLUSTER_MODE,
    SparkTarget,
    UnsupportedDeployModeError,
)
from airflow_finalckpt.storage import CheckpointStorage

#: 2: batch_size may be "auto", with target_batch_s and hints_scope.
JOB_FORMAT = 2
DRIVERS_DIR = "drivers"
HEARTBEAT_INTERVAL_S = 5.0
#: A heartbeat older than this means the driver is gone.
HEARTBEAT_STALE_S = 30.0
STORE_URL_ENV = env_var_name("store_url")
STORAGE_URI_ENV = env_var_name("storage_uri")
STORAGE_OPTIONS_ENV = env_var_name("storage_options")


class DriverError(FinalCheckpointError):
    """The Spark driver failed, or ended without a result."""


class CodeShippingError(ConfigurationError):
    """The stage's code cannot be shipped to the Spark driver."""


def driver_script() -> str:
    """The application file ``spark-submit`` runs (in the installed package)."""
    from airflow_finalckpt.spark import driver

    return os.path.abspath(driver.__file__)


def spark_submit_binary() -> str:
    """``spark-submit`` on PATH, else the one shipped in the pyspark package."""
    found = shutil.which("spark-submit")
    if found:
        return "spark-submit"
    import pyspark

    candidate = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    if os.path.exists(candidate):
        return candidate
    raise ConfigurationError(
        "spark-submit is not on PATH and pyspark ships none: install Spark or pyspark"
    )


# ----------------------------------------------------------------------------- code shipping


def code_reference(fn: Callable[..., Any] | None) -> str | None:
    """``module:qualname`` when ``fn`` is importable under that name in any process."""
    if fn is None:
        return None
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or not importable_elsewhere(module):
        return None
    ref = f"{module}:{qualname}"
    try:
        obj = resolve_reference(ref)
    except Exception:
        return None
    return ref if obj is fn else None


def resolve_reference(ref: str) -> Any:
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _unimportable_modules(objects: Sequence[Any]) -> list[Any]:
    """Modules of the given callables that another process could not import by name (DAG
    files Airflow loaded under a mangled name): their functions must be pickled by value."""
    found = []
    for obj in objects:
        name = getattr(obj, "__module__", None)
        module = sys.modules.get(name) if name else None
        if module is None or name is None or name == "__main__":
            continue
        if not importable_elsewhere(name) and module not in found:
            found.append(module)
    return found


def _dags_folder() -> str | None:
    try:
        from airflow.configuration import conf

        return os.path.abspath(conf.get("core", "dags_folder"))
    except Exception:
        return None


def importable_elsewhere(module: str) -> bool:
    """Whether a fresh interpreter with this environment imports ``module`` by name: its top
    package is found by the import machinery (not merely present in ``sys.modules``, where
    Airflow puts DAG files under mangled names) and does not live in the dags folder (on
    ``sys.path`` only inside Airflow's processes)."""
    if module == "__main__":
        return False
    top = module.split(".", 1)[0]
    spec = None
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(top, None)
        except Exception:
            spec = None
        if spec is not None:
            break
    if spec is None:
        return False
    origin = spec.origin or next(iter(spec.submodule_search_locations or []), None)
    dags = _dags_folder()
    return not (origin and dags and os.path.abspath(origin).startswith(dags + os.sep))


def pickle_code(payload: Mapping[str, Any], stage_id: str) -> bytes:
    """cloudpickle the stage's code; a clear error when something cannot be pickled."""
    from pyspark import cloudpickle

    by_value = _unimportable_modules([v for v in payload.values() if callable(v)])
    for module in by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return bytes(cloudpickle.dumps(dict(payload)))
    except Exception as first:
        for name, value in payload.items():
            try:
                cloudpickle.dumps(value)
            except Exception as exc:
                raise CodeShippingError(
                    f"stage {stage_id!r}: its {name} cannot be shipped to the Spark driver "
                    f"(cloudpickle: {type(exc).__name__}: {exc}). Use an importable top-level "
                    "function (module:qualname) or make the objects it references picklable "
                    "(no open connections, locks or SparkSessions in closures)"
                ) from exc
        raise CodeShippingError(
            f"stage {stage_id!r}: its code cannot be pickled: {type(first).__name__}: {first}"
        ) from first
    finally:
        for module in by_value:
            cloudpickle.unregister_pickle_by_value(module)


# ----------------------------------------------------------------------------- the job


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
    code: dict[str, str | None] = field(default_factory=dict)
    spark_conf: dict[str, str] = field(default_factory=dict)
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    format: int = JOB_FORMAT

    def to_json(self) -> bytes:
        doc = dataclasses.asdict(self)
        doc["splits"] = list(self.splits)
        return json.dumps(doc, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> DriverJob:
        doc = json.loads(data)
        if doc.get("format") != JOB_FORMAT:
            raise ConfigurationError(
                f"driver job format {doc.get('format')!r} is not {JOB_FORMAT}: the driver and "
                "the Airflow task run different airflow-finalckpt versions"
            )
        doc["splits"] = tuple(doc["splits"])
        return cls(**doc)


def submission_dir(stage_id: str, submission_id: str | None = None) -> str:
    return posixpath.join(DRIVERS_DIR, stage_id, *([submission_id] if submission_id else []))


def result_to_json(result: RunResult, **extra: Any) -> bytes:
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


class Files:
    """The driver files of one stage in the checkpoint storage."""

    def __init__(self, storage: CheckpointStorage, pipeline_key: str, stage_id: str) -> None:
        self.storage = storage
        self.pipeline_key = pipeline_key
        self.stage_id = stage_id

    def path(self, submission_id: str | None, name: str) -> str:
        return posixpath.join(submission_dir(self.stage_id, submission_id), name)

    def write(self, submission_id: str | None, name: str, data: bytes) -> str:
        rel = self.path(submission_id, name)
        self.storage.write_state(self.pipeline_key, rel, data)
        return self.storage.resolve_handle(self.pipeline_key, rel)

    def read(self, submission_id: str | None, name: str) -> bytes | None:
        full = self.storage.resolve_handle(self.pipeline_key, self.path(submission_id, name))
        fs = self.storage.fs
        try:
            fs.invalidate_cache(posixpath.dirname(full))
            return bytes(fs.cat_file(full))
        except FileNotFoundError:
            return None

    def read_json(self, submission_id: str | None, name: str) -> dict[str, Any] | None:
        data = self.read(submission_id, name)
        return None if data is None else dict(json.loads(data))

    def exists(self, submission_id: str | None, name: str) -> bool:
        return self.read(submission_id, name) is not None


def heartbeat_age(beat: Mapping[str, Any] | None) -> float | None:
    if beat is None:
        return None
    return max(0.0, time.time() - float(beat.get("at", 0)))


class DriverLost(DriverError):
    """A driver this try reattached to stopped heartbeating without a result."""


class SubmitLauncher:
    """Submits one stage attempt and returns the driver's outcome (or reattaches to one)."""

    def __init__(
        self,
        target: SparkTarget,
        storage: CheckpointStorage,
        *,
        store_url: str,
        store_url_masked: str,
        storage_options: Mapping[str, Any] | None = None,
        spark_conf: Mapping[str, str] | None = None,
        app_name: str = "finalckpt-stage",
        log: Any = None,
        heartbeat_stale_s: float = HEARTBEAT_STALE_S,
        poll_interval_s: float = 1.0,
        hook_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.target = target
        self.storage = storage
        self.store_url = store_url
        self.store_url_masked = store_url_masked
        self.storage_options = dict(storage_options or {})
        self.spark_conf = dict(spark_conf or {})
        self.app_name = app_name
        import logging

        self.log = log or logging.getLogger(__name__)
        self.heartbeat_stale_s = heartbeat_stale_s
        self.poll_interval_s = poll_interval_s
        self.hook_factory = hook_factory
        self.hook: Any = None
        self._files: Files | None = None
        self._submission: str | None = None
        self._killed = False
        #: the last run's resumable job (its ``previous`` decision and its state store kind)
        self.resumable: Any = None
        self.state_store_kind: str | None = None

    # -- building the job ------------------------------------------------------------------

    def build_job(
        self,
        *,
        pipeline_key: str,
        stage_id: str,
        splits: Sequence[str],
        batch_size: int | str,
        checkpoint_interval_s: float,
        commit_mode: str,
        upstream_manifests: Mapping[str, list[str]],
        transform: Callable[..., Any],
        on_finish: Callable[..., Any] | None,
        sinks: Sequence[Any],
        target_batch_s: float = DEFAULT_TARGET_BATCH_S,
        hints_scope: str | None = None,
    ) -> tuple[DriverJob, bytes | None]:
        submission_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        code: dict[str, str | None] = {}
        to_pickle: dict[str, Any] = {}
        for name, fn in (("transform", transform), ("on_finish", on_finish)):
            ref = code_reference(fn)
            if fn is None or ref is not None:
                code[name] = ref and f"ref:{ref}"
            else:
                code[name] = "pickle"
                to_pickle[name] = fn
        if sinks:
            code["sinks"] = "pickle"
            to_pickle["sinks"] = list(sinks)
        blob = pickle_code(to_pickle, stage_id) if to_pickle else None
        job = DriverJob(
            submission_id=submission_id,
            pipeline_key=pipeline_key,
            stage_id=stage_id,
            splits=tuple(splits),
            batch_size=batch_size,
            target_batch_s=float(target_batch_s),
            hints_scope=hints_scope,
            checkpoint_interval_s=float(checkpoint_interval_s),
            commit_mode=str(commit_mode),
            upstream_manifests={k: list(v) for k, v in upstream_manifests.items()},
            storage_uri=self.storage.root_uri,
            store_url_masked=self.store_url_masked,
            code=code,
            spark_conf=dict(self.spark_conf),
        )
        return job, blob

    # -- running ---------------------------------------------------------------------------

    def run(
        self,
        job: DriverJob,
        code: bytes | None,
        context: Mapping[str, Any] | None = None,
        *,
        durable: bool = True,
    ) -> DriverOutcome:
        """Reattach to the driver a previous try of this task submitted if it still runs,
        else submit ``job`` (``ResumableJobMixin.execute_resumable``).

        The record of the submission lives in Airflow's task state store
        (``context["task_state_store"]``, Airflow 3.3); without one (``execute`` called with
        a hand-made context) in the checkpoint storage, ``drivers/<stage>/current.json``."""
        from airflow_finalckpt.spark.resumable import ResumableSubmission, StorageStateStore

        context = context or {}
        files = Files(self.storage, job.pipeline_key, job.stage_id)
        self._files = files
        store = context.get("task_state_store")
        if store is None:
            store = StorageStateStore(files)
            self.state_store_kind = "checkpoint storage"
            self.log.info(
                "stage %s: no Airflow task state store in this context: the submission record "
                "is kept in the %s",
                job.stage_id,
                StorageStateStore.kind,
            )
        else:
            self.state_store_kind = "airflow"
        mixin_context: Any = {"task_state_store": store}  # the Context keys the mixin reads
        ti = context.get("ti")
        if ti is not None and hasattr(ti, "stats_tags"):
            mixin_context["ti"] = ti
        resumable = ResumableSubmission(self, job, code, durable=durable)
        self.resumable = resumable
        try:
            return resumable.execute_resumable(mixin_context)
        except DriverLost as lost:
            # the reattached driver is gone: its record now reads LOST, so this submits afresh
            self.log.info("%s: submitting a new driver", lost)
            previous = resumable.previous
            resumable = ResumableSubmission(self, job, code, durable=durable)
            self.resumable = resumable
            outcome = resumable.execute_resumable(mixin_context)
            resumable.previous = resumable.previous or previous
            return outcome

    def _env(self) -> dict[str, str]:
        env = {
            STORE_URL_ENV: self.store_url,
            STORAGE_URI_ENV: self.storage.root_uri,
        }
        if self.storage_options:
            env[STORAGE_OPTIONS_ENV] = json.dumps(self.storage_options)
        return env

    def _conf(self) -> dict[str, str]:
        conf = {"spark.ui.enabled": "false", **self.spark_conf}
        if not self.target.is_cluster_deploy:
            # The driver runs on this machine: use this interpreter (it has the plugin).
            conf.setdefault("spark.pyspark.driver.python", sys.executable)
        return conf

    def make_hook(self, job: DriverJob, spec_uri: str) -> Any:
        if self.target.is_cluster_deploy and self.target.master.startswith("spark://"):
            # resolve_target refuses it already; a last guard before anything is submitted
            raise UnsupportedDeployModeError(STANDALONE_PYTHON_CLUSTER_MODE)
        kwargs: dict[str, Any] = {
            "conf": self._conf(),
            "name": f"{self.app_name}-{job.submission_id}",
            "application_args": ["--job", spec_uri],
            "env_vars": self._env(),
            "spark_binary": spark_submit_binary(),
            "deploy_mode": self.target.deploy_mode,
        }
        if self.hook_factory is not None:
            return self.hook_factory(**kwargs)
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        if self.target.conn_id and not self._master_overridden():
            return SparkSubmitHook(conn_id=self.target.conn_id, **kwargs)
        return master_submit_hook(self.target.master, **kwargs)

    def _master_overridden(self) -> bool:
        return "master from spark_master" in self.target.source

    def _outcome(
        self, files: Files, sid: str, doc: Mapping[str, Any], *, reconnected: bool
    ) -> DriverOutcome:
        error = doc.get("error")
        if error:
            raise DriverError(
                f"stage {files.stage_id!r}: the Spark driver (submission {sid}, epoch "
                f"{doc.get('epoch')}) failed: {error.get('type')}: {error.get('message')}\n"
                f"{error.get('traceback', '')}"
            )
        result = result_from_doc(doc["result"])
        epoch = doc["result"].get("epoch")
        if epoch is None:
            raise DriverError(f"stage {files.stage_id!r}: driver result without an epoch")
        return DriverOutcome(
            result=result,
            epoch=int(epoch),
            submission_id=sid,
            reconnected=reconnected,
            app_id=doc["result"].get("app_id"),
        )

    def on_kill(self) -> None:
        """Stop the driver: the hook's on_kill (spark-submit, YARN app, driver pod) plus the
        cancel marker every driver checks with its heartbeat (also a reattached one)."""
        self._killed = True
        if self._files is not None and self._submission is not None:
            try:
                self._files.write(self._submission, "cancel", b"cancelled by on_kill\n")
            except Exception as exc:  # best effort: the hook still kills what it started
                self.log.info("cannot write the cancel marker: %s", exc)
        if self.hook is not None:
            self.hook.on_kill()


def master_submit_hook(master: str, **kwargs: Any) -> Any:
    """A SparkSubmitHook for an explicit master (``spark_master`` argument, no connection)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    class _Hook(SparkSubmitHook):
        def _resolve_connection(self) -> dict[str, Any]:
            conn: dict[str, Any] = {
                "master": master,
                "queue": None,
                "deploy_mode": self._deploy_mode,
                "spark_binary": self.spark_binary or "spark-submit",
                "namespace": None,
                "principal": self._principal,
                "keytab": self._keytab,
                "rest_scheme": "http",
                "rest_port": 6066,
                "rest_endpoint": None,
            }
            if "spark.kubernetes.namespace" in self._conf:
                conn["namespace"] = self._conf["spark.kubernetes.namespace"]
            return conn

    return _Hook(conn_id="__finalckpt_no_connection__", **kwargs)
