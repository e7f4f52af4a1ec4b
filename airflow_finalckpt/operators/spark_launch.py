"""How a stage task reaches Spark: an in-process session (local, client mode, Spark Connect)
or a spark-submitted driver, and how a killed task stops that Spark work.

A mixin of the stage operator, kept apart so the operator module holds the task's life cycle
(register, run, defer, commit) and this one the Spark launch details.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_finalckpt.hooks.masking import code_signing_key
from airflow_finalckpt.operators.attempt import StageRun
from airflow_finalckpt.spark.launch import ExecutionMode, SparkTarget, resolve_target
from airflow_finalckpt.spark.launch.submit import SubmitLauncher
from airflow_finalckpt.spark.secrets import SigningKey
from airflow_finalckpt.store.deployment_secrets import CODE_SIGNING_KEY, ensure_secret

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pyspark.sql import SparkSession

    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.runtime.assembly import StageCode, StageJob
    from airflow_finalckpt.runtime.runner import StageCloser
    from airflow_finalckpt.storage import CheckpointStorage

#: A stage run through spark-submit: its submission id, driver epoch and Spark application id.
SPARK_SUBMISSION_KEY = "spark_submission"


class SparkLaunchMixin:
    """The stage operator's Spark side: session, target, spark-submit and on_kill."""

    stage_id: str
    dag_id: str
    task_id: str
    spark_conf: dict[str, str]
    spark_master: str | None
    spark_conn_id: str
    spark_execution: str | None
    spark_deploy_mode: str | None
    log: Any  # BaseOperator's task logger
    _spark: SparkSession | None
    #: the operator's: closes the stage once its final checkpoint has committed
    _closer: Callable[[Coordinator, int | None], StageCloser]

    def _spark_session(self) -> SparkSession:
        """The in-process session: ``local[*]``, a cluster master (client mode) or, for an
        ``sc://`` URL, a Spark Connect session (static settings such as the UI are the
        Connect server's, so only ``spark_conf`` is applied there).
        """
        from pyspark.sql import SparkSession  # pyspark: only when this task runs Spark

        target = self._spark_target()
        self.log.info("stage %s runs Spark %s", self.stage_id, target.describe())
        builder = SparkSession.builder
        if target.mode is ExecutionMode.CONNECT:
            builder = builder.remote(target.master)
            conf = dict(self.spark_conf)
        else:
            builder = builder.master(target.master)
            conf = {"spark.ui.enabled": "false", **self.spark_conf}
        builder = builder.appName(f"finalckpt-{self.dag_id}-{self.task_id}")
        for k, v in conf.items():
            builder = builder.config(k, v)
        self._spark = builder.getOrCreate()
        return self._spark

    def _spark_target(self) -> SparkTarget:
        """Execution mode, master and deploy mode (``airflow_finalckpt.spark.launch``)."""
        target: SparkTarget | None = getattr(self, "_resolved_target", None)
        if target is None:
            target = resolve_target(
                spark_master=self.spark_master,
                spark_conn_id=self.spark_conn_id,
                execution=self.spark_execution,
                deploy_mode=self.spark_deploy_mode,
            )
            self._resolved_target = target
        return target

    def _run_submitted(
        self,
        context: Context,
        coordinator: Coordinator,
        settings: Any,
        storage: CheckpointStorage,
        job: StageJob,
        code: StageCode,
    ) -> StageRun:
        """spark-submit the stage: the driver runs the runtime; this task reads its result
        (or reattaches to a driver a previous try submitted and that still runs: the
        submission is remembered in the task state store, see ``spark.launch.resumable``).
        """
        launcher = SubmitLauncher(
            self._spark_target(),
            storage,
            store_url=settings.store_url,
            store_url_masked=settings.masked_store_url(),
            storage_options=settings.storage_options,
            spark_conf=self.spark_conf,
            app_name=f"finalckpt-{self.dag_id}-{self.task_id}",
            log=self.log,
            code_signing_key=self._signing_key(coordinator),
        )
        self._launcher: SubmitLauncher | None = launcher
        driver_job, pickled = launcher.build_job(job, code)
        # ResumableJobMixin: the submission record in the task state store across tries
        outcome = launcher.run(driver_job, pickled, context)
        resumable = launcher.resumable
        context["ti"].xcom_push(
            key=SPARK_SUBMISSION_KEY,
            value={
                "submission_id": outcome.submission_id,
                "epoch": outcome.epoch,
                "app_id": outcome.app_id,
                "reconnected": outcome.reconnected,
                "previous": resumable.previous if resumable is not None else None,
                "state_store": launcher.state_store_kind,
            },
        )
        return StageRun(
            result=outcome.result,
            epoch=outcome.epoch,
            closer=self._closer(coordinator, outcome.epoch),
            spark_started=True,
        )

    @staticmethod
    def _signing_key(coordinator: Coordinator) -> SigningKey:
        """``[finalckpt] code_signing_key``, else the deployment's generated key from the store
        (created by the first task that needs it); masked in the task log either way.
        """
        configured = code_signing_key()
        if configured:
            return SigningKey(configured, configured=True)
        from airflow.sdk.log import mask_secret

        generated = ensure_secret(coordinator.engine, CODE_SIGNING_KEY)
        mask_secret(generated)
        return SigningKey(generated, configured=False)

    def on_kill(self) -> None:
        """Stop the Spark work of this attempt (its uncommitted batch is redone later): the
        in-process session's jobs, or the submitted driver (through the hook's on_kill).
        """
        launcher, self._launcher = getattr(self, "_launcher", None), None
        if launcher is not None:
            launcher.on_kill()
        if self._spark is not None:
            spark, self._spark = self._spark, None
            if self._spark_target().mode is ExecutionMode.CONNECT:
                spark.interruptAll()  # a Connect session has no SparkContext
            else:
                spark.sparkContext.cancelAllJobs()
            spark.stop()
