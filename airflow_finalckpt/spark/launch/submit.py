"""Run a stage through ``spark-submit``: the Spark driver runs the stage runtime.

Runs in the Airflow task. It writes a *job* for the driver into the checkpoint storage (a shared
location: in cluster deploy mode the driver runs on another machine; the files are listed in
``spark.job``), submits ``airflow_finalckpt/spark/driver.py`` through the Spark provider's
``SparkSubmitHook`` and, when the driver ends, reads ``result.json``. The coordination store
URL, the signing key and credential storage options go to the driver in a secrets file only the
job can read (``spark.secrets``), named by path in the driver's arguments: never on the
spark-submit command line, in a pod spec, in the spec file or in the checkpoint storage;
``spec.json`` and ``code.pkl`` are sealed (encrypted and authenticated) with that key
(``spark.sealed_spec``). spark-submit runs with the worker's environment minus Airflow's
connections, variables and configuration (``spark.launch.driver_env``).

Reattaching across task tries is ``airflow.sdk.ResumableJobMixin`` with Airflow's task state
store (``spark.launch.resumable``): the submission record is kept under
``finalckpt_spark_submission`` (``drivers/<stage>/current.json`` only when the context has no
task state store). A later try reattaches to a driver that still heartbeats and has no result,
and submits a new one when the recorded driver ended without a result (killed), failed, was
suspended or stopped heartbeating; the new driver's attempt takes a new epoch, so a stale
driver that comes back is fenced off by the coordinator.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from airflow_finalckpt.config import mask_storage_options
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.runtime.assembly import StageCode, StageJob
from airflow_finalckpt.sinks.connections import connection_env_name, connection_secrets
from airflow_finalckpt.spark.job import (
    HEARTBEAT_STALE_S,
    STORAGE_OPTIONS_ENV,
    STORAGE_URI_ENV,
    STORE_URL_ENV,
    DriverJob,
    DriverLost,
    DriverOutcome,
    Files,
    resolve_reference,
)
from airflow_finalckpt.spark.launch import (
    STANDALONE_PYTHON_CLUSTER_MODE,
    SparkTarget,
    UnsupportedDeployModeError,
)
from airflow_finalckpt.spark.launch.resumable import ResumableSubmission, StorageStateStore
from airflow_finalckpt.spark.sealed_spec import seal_spec
from airflow_finalckpt.spark.secrets import (
    CODE_KEY_ENV,
    SigningKey,
    code_key,
    remove_secrets_file,
    seal_code,
    write_secrets_file,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.deployment_secrets import CODE_SIGNING_KEY, ensure_secret
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store_password import STORE_PASSWORD_ENV

#: A Kubernetes cluster-mode driver takes its credentials from a Kubernetes Secret.
K8S_SECRET_REF = "spark.kubernetes.driver.secretKeyRef."
K8S_DRIVER_ENV = "spark.kubernetes.driverEnv."


def spark_defaults() -> dict[str, str]:
    """The keys and values of ``$SPARK_CONF_DIR/spark-defaults.conf``, which spark-submit
    applies too (the Helm chart renders the driver's Secret references there).
    """
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        return {}
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf")) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    pairs = (line.strip().split(None, 1) for line in lines)
    return {p[0]: p[1] if len(p) > 1 else "" for p in pairs if p and not p[0].startswith("#")}


def missing_secret_refs(needed: Sequence[str], conf: Mapping[str, str]) -> list[str]:
    """The env variables of ``needed`` no ``secretKeyRef`` of ``conf`` gives the driver. The
    store URL may also come as a password-free ``driverEnv`` value plus a Secret reference for
    ``AIRFLOW__FINALCKPT__STORE_PASSWORD`` (what the Helm chart renders).
    """
    missing = [n for n in needed if K8S_SECRET_REF + n not in conf]
    split_store = K8S_DRIVER_ENV + STORE_URL_ENV in conf and (
        K8S_SECRET_REF + STORE_PASSWORD_ENV in conf
    )
    return [n for n in missing if not (n == STORE_URL_ENV and split_store)]


def deployment_signing_key(configured: str | None, store_url: str) -> SigningKey:
    """The signing key of a deployment: ``[finalckpt] code_signing_key`` when set, else the
    random key the deployment generated once in its coordination store (never derived from
    anything an outsider could know, such as the store URL).
    """
    if configured:
        return SigningKey(configured, configured=True)
    engine = make_engine(store_url)
    try:
        return SigningKey(ensure_secret(engine, CODE_SIGNING_KEY), configured=False)
    finally:
        engine.dispose()


class CodeShippingError(ConfigurationError):
    """The stage's code cannot be shipped to the Spark driver."""


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


def _unimportable_modules(objects: Sequence[Any]) -> list[Any]:
    """Modules of the given callables that another process could not import by name (DAG
    files Airflow loaded under a mangled name): their functions must be pickled by value.
    """
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
    ``sys.path`` only inside Airflow's processes).
    """
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
    """Cloudpickle the stage's code; a clear error when something cannot be pickled.

    The cloudpickle package, not pyspark's bundled copy: the driver (the cluster's pyspark,
    3.5 or 4.x) unpickles with the same package, whatever cloudpickle its pyspark bundles.
    """
    import cloudpickle

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
        code_signing_key: str | SigningKey | None = None,
    ) -> None:
        self.target = target
        #: the deployment's signing key (a string: ``[finalckpt] code_signing_key``); None:
        #: the store's, fetched when first needed (``signing_key``)
        self._signing: SigningKey | None = (
            SigningKey(code_signing_key, configured=True)
            if isinstance(code_signing_key, str)
            else code_signing_key
        )
        #: the secrets file of the submission being started (removed once spark-submit ends)
        self.secrets_path: str | None = None
        self.storage = storage
        self.store_url = store_url
        self.store_url_masked = store_url_masked
        self.storage_options = dict(storage_options or {})
        self.spark_conf = dict(spark_conf or {})
        self.app_name = app_name
        self.log = log or logging.getLogger(__name__)
        self.heartbeat_stale_s = heartbeat_stale_s
        self.poll_interval_s = poll_interval_s
        self.hook_factory = hook_factory
        self.hook: Any = None
        self._files: Files | None = None
        #: the submission this launcher submitted or reattached to (``on_kill`` cancels it)
        self.submission: str | None = None
        self.killed = False
        #: the last run's resumable job (its ``previous`` decision and its state store kind)
        self.resumable: Any = None
        #: the sinks' resolved Airflow connections (secrets file only, never ``code.pkl``)
        self.sink_connections: dict[str, dict[str, Any]] = {}
        self.state_store_kind: str | None = None

    # -- building the job ------------------------------------------------------------------

    def signing_key(self) -> SigningKey:
        """The key ``code.pkl`` and ``spec.json`` are sealed with."""
        if self._signing is None:
            self._signing = deployment_signing_key(None, self.store_url)
        return self._signing

    def seal_spec(self, job: DriverJob, code: bytes | None) -> bytes:
        """``spec.json``'s bytes: ``job`` sealed with the deployment's key, bound to ``code``."""
        return seal_spec(job, code, self.signing_key().value)

    def build_job(self, stage: StageJob, code: StageCode) -> tuple[DriverJob, bytes | None]:
        """The job spec of a new submission, and the pickled code it cannot name by reference."""
        submission_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        refs: dict[str, str | None] = {}
        to_pickle: dict[str, Any] = {}
        named = (
            ("transform", code.transform),
            ("on_finish", code.on_finish),
            ("split_bytes", code.split_bytes),  # a mapping has no reference: pickled
        )
        for name, fn in named:
            ref = code_reference(fn) if callable(fn) else None
            if fn is None or ref is not None:
                refs[name] = ref and f"ref:{ref}"
            else:
                refs[name] = "pickle"
                to_pickle[name] = fn
        if code.sinks:
            refs["sinks"] = "pickle"
            to_pickle["sinks"] = list(code.sinks)  # a conn_id sink pickles its id only
        self.sink_connections = connection_secrets(code.sinks)
        blob = None
        if to_pickle:
            key = code_key(self.signing_key().value)
            blob = seal_code(pickle_code(to_pickle, stage.spec.stage_id), key)
        job = DriverJob.for_stage(
            stage,
            submission_id=submission_id,
            storage_uri=self.storage.root_uri,
            store_url_masked=self.store_url_masked,
            code=refs,
            spark_conf=self.spark_conf,
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
        a hand-made context) in the checkpoint storage, ``drivers/<stage>/current.json``.
        """
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
            return cast(DriverOutcome, resumable.execute_resumable(mixin_context))
        except DriverLost as lost:
            # the reattached driver is gone: its record now reads LOST, so this submits afresh
            self.log.info("%s: submitting a new driver", lost)
            previous = resumable.previous
            resumable = ResumableSubmission(self, job, code, durable=durable)
            self.resumable = resumable
            outcome = cast(DriverOutcome, resumable.execute_resumable(mixin_context))
            resumable.previous = resumable.previous or previous
            return outcome

    def _has_secret_options(self) -> bool:
        return mask_storage_options(self.storage_options) != self.storage_options

    def _env(self) -> dict[str, str]:
        """The driver's environment: no credential (the hook may turn it into ``--conf``)."""
        env = {STORAGE_URI_ENV: self.storage.root_uri}
        if self.storage_options and not self._has_secret_options():
            env[STORAGE_OPTIONS_ENV] = json.dumps(self.storage_options)
        return env

    def _secrets(self) -> dict[str, Any]:
        secrets: dict[str, Any] = {
            "store_url": self.store_url,
            "code_signing_key": self.signing_key().value,
            "storage_options": self.storage_options if self._has_secret_options() else None,
        }
        if self.sink_connections:  # the conn_id sinks' resolved connections
            secrets["sink_connections"] = self.sink_connections
        return secrets

    def _on_kubernetes_cluster(self) -> bool:
        return self.target.is_cluster_deploy and self.target.master.startswith("k8s://")

    def _secrets_args(self) -> tuple[list[str], list[str]]:
        """The driver's ``--secrets`` argument and the files spark-submit ships (YARN cluster
        mode: the secrets file through YARN's private staging directory); a Kubernetes
        cluster-mode driver reads its credentials from Kubernetes Secrets instead.
        """
        if self._on_kubernetes_cluster():
            # a generated key: the driver reads it from the store, as it reads everything else
            configured = self.signing_key().configured
            needed = [STORE_URL_ENV] + ([CODE_KEY_ENV] if configured else [])
            if self._has_secret_options():
                needed.append(STORAGE_OPTIONS_ENV)
            # keys are conn ids, "storage:<conn id>" for a storage connection
            conn_ids = dict.fromkeys(c.rpartition(":")[2] for c in self.sink_connections)
            needed.extend(connection_env_name(c) for c in conn_ids)
            missing = missing_secret_refs(needed, {**spark_defaults(), **self.spark_conf})
            if missing:
                confs = ", ".join(f"{K8S_SECRET_REF}{n}=<secret>:<key>" for n in missing)
                raise ConfigurationError(
                    "a Kubernetes cluster-mode driver takes its credentials from Kubernetes "
                    f"Secrets, never from the pod spec: set {confs} in spark_conf or the "
                    "connection's extras (the Helm chart's Secret, docs/spark-cluster.md)"
                )
            return [], []
        remove_secrets_file(self.secrets_path)
        self.secrets_path = write_secrets_file(self._secrets())
        if self.target.is_cluster_deploy:  # YARN: shipped beside the driver, found by name
            return ["--secrets", os.path.basename(self.secrets_path)], [self.secrets_path]
        return ["--secrets", self.secrets_path], []

    def cleanup_secrets(self) -> None:
        """Remove the secrets file once spark-submit ended (the driver removes it on reading)."""
        remove_secrets_file(self.secrets_path)
        self.secrets_path = None

    def _conf(self) -> dict[str, str]:
        conf = {"spark.ui.enabled": "false", **self.spark_conf}
        if not self.target.is_cluster_deploy:
            # The driver runs on this machine: use this interpreter (it has the plugin).
            conf.setdefault("spark.pyspark.driver.python", sys.executable)
        return conf

    def make_hook(self, job: DriverJob, spec_uri: str) -> Any:
        """The SparkSubmitHook of this job: master, deploy mode, conf, the driver's environment."""
        if self.target.is_cluster_deploy and self.target.master.startswith("spark://"):
            # resolve_target refuses it already; a last guard before anything is submitted
            raise UnsupportedDeployModeError(STANDALONE_PYTHON_CLUSTER_MODE)
        secrets_args, files = self._secrets_args()
        kwargs: dict[str, Any] = {
            "conf": self._conf(),
            "name": f"{self.app_name}-{job.submission_id}",
            "application_args": ["--job", spec_uri, *secrets_args],
            "env_vars": self._env(),
            "spark_binary": spark_submit_binary(),
            "deploy_mode": self.target.deploy_mode,
        }
        if files:
            kwargs["files"] = ",".join(files)
        if self.hook_factory is not None:
            return self.hook_factory(**kwargs)
        from airflow_finalckpt.spark.launch.submit_hook import (
            ScopedEnvSubmitHook,
            master_submit_hook,
        )

        if self.target.conn_id and not self._master_overridden():
            return ScopedEnvSubmitHook(conn_id=self.target.conn_id, **kwargs)
        return master_submit_hook(self.target.master, **kwargs)

    def _master_overridden(self) -> bool:
        return "master from spark_master" in self.target.source

    def on_kill(self) -> None:
        """Stop the driver: the hook's on_kill (spark-submit, YARN app, driver pod) plus the
        cancel marker every driver checks with its heartbeat (also a reattached one).
        """
        self.killed = True
        if self._files is not None and self.submission is not None:
            try:
                self._files.write(self.submission, "cancel", b"cancelled by on_kill\n")
            except Exception as exc:  # best effort: the hook still kills what it started
                self.log.info("cannot write the cancel marker: %s", exc)
        if self.hook is not None:
            self.hook.on_kill()
