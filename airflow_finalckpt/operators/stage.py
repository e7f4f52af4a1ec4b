"""The stage operator: one Airflow task runs one pipeline stage on Spark.

``execute`` registers the pipeline graph (the DAG's stage tasks and their edges), restores a
savepoint named in the DAG run conf (``restore_from``) once, then runs the stage runtime: the
pending splits in batches of Spark work, finish(), the eager final checkpoint. Waiting for the
final checkpoint is deferred to the triggerer (no worker slot); ``execute_complete`` commits the
stage's sink transactions up to that checkpoint, aborts later ones, and only then succeeds, so
downstream tasks (and Asset consumers) never see uncommitted data.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.arguments import (
    check_bool,
    check_callable,
    check_choice,
    check_optional_seconds,
    check_optional_text,
    check_seconds,
    check_splits,
    check_stage_id,
    check_string_mapping,
    check_text,
)
from airflow_finalckpt.core.batching import DEFAULT_TARGET_BATCH_S, policy_from
from airflow_finalckpt.core.drain import check_on_drain
from airflow_finalckpt.core.driving import drive_request
from airflow_finalckpt.core.errors import (
    FinalCheckpointError,
    InvalidStageArgumentError,
    StageDefinitionError,
)
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import EndOfData
from airflow_finalckpt.core.pipeline_keys import KeyOrigin, default_pipeline_key, hints_scope
from airflow_finalckpt.core.ports import CoordinatorPort
from airflow_finalckpt.core.rerun import Publication
from airflow_finalckpt.core.run_conf import ALLOW_DROP_STAGES_KEY, parse_allow_drop_stages
from airflow_finalckpt.core.split_bytes import SplitBytes, check_split_bytes
from airflow_finalckpt.hooks.finalckpt import FinalCkptHook
from airflow_finalckpt.hooks.masking import mask_task_secrets
from airflow_finalckpt.hooks.sink_connections import bind_sink_connections
from airflow_finalckpt.lineage import stage_lineage
from airflow_finalckpt.operators import scheduling
from airflow_finalckpt.operators.arguments import check_deploy_mode, check_execution, check_sinks
from airflow_finalckpt.operators.attempt import StageRun, coordinator_options
from airflow_finalckpt.operators.definition import check_pipeline_definition
from airflow_finalckpt.operators.drain import drain_behaviour
from airflow_finalckpt.operators.failures import fail_permanent_errors
from airflow_finalckpt.operators.links import PipelinePageLink
from airflow_finalckpt.operators.publishing import (
    END_OF_DATA_KEY,
    STAGE_RUN_KEY,
    announce_commit,
    commit_extra,
    log_resume_point,
    primary_splits,
    publish_end_of_data,
    upstream_manifests,
)
from airflow_finalckpt.operators.rerun import prepare_attempt, record_publication
from airflow_finalckpt.operators.run_keys import ResolvedKey, resolve_key
from airflow_finalckpt.operators.spark_launch import SPARK_SUBMISSION_KEY, SparkLaunchMixin
from airflow_finalckpt.runtime.assembly import StageCode, StageJob, assemble_runner
from airflow_finalckpt.runtime.runner import (
    CommitMode,
    RunStatus,
    StageCloser,
    StageSpec,
)
from airflow_finalckpt.sources.claims import claim_splits
from airflow_finalckpt.spark.driver import spark_logic
from airflow_finalckpt.spark.launch import ExecutionMode
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.triggers.final_checkpoint import FinalCheckpointTrigger, StageResumeTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pyspark.sql import SparkSession

    from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
    from airflow_finalckpt.spark.stage import Transform

log = logging.getLogger(__name__)

__all__ = [  # the XCom keys and publishing helpers keep their former import path
    "END_OF_DATA_KEY",
    "SPARK_SUBMISSION_KEY",
    "STAGE_RUN_KEY",
    "FinalCheckpointStageOperator",
    "StageRun",
    "commit_extra",
    "coordinator_options",
    "default_pipeline_key",
    "hints_scope",
    "primary_splits",
]


class FinalCheckpointStageOperator(SparkLaunchMixin, scheduling.RendersSinksOnCopies, BaseOperator):
    """Run a PySpark stage with exactly-once output committed at its final checkpoint.

    :param transform: ``transform(ctx) -> DataFrame | None`` called per split batch; the frame
        is the batch's output (read by downstream stages, written to ``sinks``).
    :param on_finish: called once at finish() (end of input or drain): flush state, e.g. fire
        every open event-time window.
    :param stage_id: the stage's id in the pipeline graph and the coordination store (default:
        the task id); keep it when renaming the task, so progress and savepoints still match.
        Unique in the DAG (two tasks with one stage id are the DAG file's import error).
    :param splits: a source stage's split ids: a list, a callable of the run's ``RunContext``
        (or of nothing), or an incremental source (``airflow_finalckpt.sources``: what is new
        since the last committed run, docs/sources.md); default: the ``primary_input``'s parts
        (``allow_empty=False``: none fails).
    :param split_bytes: input bytes of each of a source's splits (a dict, or a callable of one
        split id, run where the Spark driver runs; None: unknown), so its first auto batch is
        sized from bytes instead of a one-split probe (``sizing.file_bytes`` for file splits).
    :param primary_input: the upstream stage whose output parts are this stage's splits
        (default: the only upstream stage); a stage id that is not upstream is the DAG file's
        import error.
    :param sinks: two-phase-commit sinks (their ``template_fields`` are rendered per run; their
        Airflow connections, ``conn_id``, are resolved when the task runs). Sink ids are unique
        in the pipeline and no two sinks of it write one table (the DAG file's import error).
    :param pipeline_key: groups DAG runs into one pipeline run (templated; default: DAG id +
        run id, or ``dag_run.conf["pipeline_key"]``).
    :param batch_size: ``"auto"`` (default): batches sized from measured throughput to last
        about ``target_batch_s``; or a fixed number of splits per batch. A transform that is not
        split-local (groupBy, window, distinct, orderBy, limit, ...: docs/protocol.md) runs as
        one batch per attempt in auto mode; a fixed size is refused for it.
    :param split_keys: the columns by which the splits partition the data (e.g.
        ``("event_date",)`` when each split is one day): grouped operators whose keys include
        them stay batchable; a value seen in two batches fails the stage.
    :param target_batch_s: how long an auto batch should take (default: ``[finalckpt]
        target_batch_s``, 30 s): a crash redoes at most one batch, a stop with savepoint answers
        within one.
    :param checkpoint_interval: seconds (or a ``timedelta``) between the periodic checkpoints
        this stage triggers while it runs (default: ``[finalckpt] checkpoint_interval_s``, 60);
        a crash loses at most the work since the last completed checkpoint.
    :param commit_mode: ``progressive`` (commit at every completed checkpoint) or ``final``
        (commit everything at the final checkpoint only; required by a sink's ``replace_slice``).
    :param spark_master: the Spark master (templated); default: the ``spark_conn_id``
        connection's master (``spark_default``), else ``local[*]``; ``sc://host:port`` is a
        Spark Connect server.
    :param spark_conf: Spark settings (``{"spark.executor.memory": "2g"}``) for the session or
        the submitted application.
    :param spark_conn_id: the Spark connection (the Spark provider's ``spark`` or
        ``spark_connect`` type) giving the master, deploy mode and execution mode.
    :param finalckpt_conn_id: the Airflow connection of the coordination store (``postgres`` or
        ``sqlite``); the default ``finalckpt_default`` is optional, any other id must exist.
    :param poll_interval: seconds between the triggerer's checks while the task waits, deferred,
        for its final checkpoint.
    :param spark_execution: ``"in-process"`` (a session in the task), ``"submit"``
        (spark-submit a driver) or ``"connect"`` (Spark Connect); default: the connection's
        ``finalckpt-execution`` extra, ``[finalckpt] spark_execution``, else from the master.
    :param spark_deploy_mode: ``"client"`` or ``"cluster"`` (submit only; default: the
        connection's ``deploy-mode`` extra, else ``client``).
    :param on_drain: a drain ``"stop"``s or ``"complete"``s this source (default: see core/drain).
    :param allow_split_list_change: resume a started stage whose split list lost splits it
        had finished (inputs removed on purpose); by default that fails the task (permanent).
    :param allow_empty: ``False`` fails a run whose splits are empty (before anything is
        recorded); by default empty input only logs a warning.
    """

    template_fields: Sequence[str] = ("pipeline_key", "spark_master", "sinks")
    ui_color = "#fde2c4"
    #: "Pipeline": the pipeline page of the task's DAG run in the Airflow UI
    operator_extra_links = (PipelinePageLink(),)

    def __init__(
        self,
        *,
        transform: Transform | None = None,
        on_finish: Transform | None = None,
        stage_id: str | None = None,
        splits: scheduling.SplitsArg | None = None,
        split_bytes: SplitBytes | None = None,
        primary_input: str | None = None,
        sinks: Sequence[TwoPhaseCommitSink] = (),
        pipeline_key: str | None = None,
        batch_size: int | str = "auto",
        split_keys: Sequence[str] = (),
        target_batch_s: float | None = None,
        checkpoint_interval: timedelta | float | None = None,
        commit_mode: CommitMode | str = CommitMode.PROGRESSIVE,
        spark_master: str | None = None,
        spark_conf: Mapping[str, str] | None = None,
        spark_conn_id: str = "spark_default",
        finalckpt_conn_id: str = "finalckpt_default",
        poll_interval: float = 0.5,
        spark_execution: str | None = None,
        spark_deploy_mode: str | None = None,
        on_drain: str | None = None,
        allow_split_list_change: bool = False,
        allow_empty: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        stage_id = check_stage_id(self.task_id if stage_id is None else stage_id)
        self.stage_id = stage_id
        self.transform: Transform = check_callable(stage_id, "transform", transform, optional=False)
        self.on_finish = check_callable(stage_id, "on_finish", on_finish, optional=True)
        self.splits = check_splits(stage_id, splits)
        #: A fixed list of split ids (serialized: the REST/CLI dry run checks the split-list
        #: rules with it); None when the task computes its splits.
        self.fixed_splits = list(self.splits) if isinstance(self.splits, list) else None
        own = splits is not None
        self.split_bytes = check_split_bytes(stage_id, split_bytes, own_splits=own)
        self.primary_input = check_optional_text(stage_id, "primary_input", primary_input)
        self.sinks = check_sinks(stage_id, sinks)
        self.pipeline_key = check_optional_text(stage_id, "pipeline_key", pipeline_key)
        try:
            policy_from(batch_size, target_batch_s)
        except ValueError as exc:
            raise InvalidStageArgumentError(f"stage {stage_id!r}: {exc}") from None
        self.batch_size = batch_size
        if isinstance(split_keys, str) or not all(isinstance(k, str) and k for k in split_keys):
            raise ValueError(
                f"stage {self.stage_id!r}: split_keys must be a tuple of column names, e.g. "
                f"('event_date',), got {split_keys!r}"
            )
        self.split_keys = tuple(split_keys)
        self.target_batch_s = target_batch_s
        if isinstance(checkpoint_interval, timedelta):
            checkpoint_interval = checkpoint_interval.total_seconds()
        self.checkpoint_interval = check_optional_seconds(
            stage_id, "checkpoint_interval", checkpoint_interval
        )
        self.commit_mode = CommitMode(
            check_choice(stage_id, "commit_mode", commit_mode, (m.value for m in CommitMode))
        )
        self.spark_master = check_optional_text(stage_id, "spark_master", spark_master)
        self.spark_conf = check_string_mapping(stage_id, "spark_conf", spark_conf)
        self.spark_conn_id = check_text(stage_id, "spark_conn_id", spark_conn_id)
        self.finalckpt_conn_id = check_text(stage_id, "finalckpt_conn_id", finalckpt_conn_id)
        self.poll_interval = check_seconds(stage_id, "poll_interval", poll_interval)
        self.spark_execution = check_execution(stage_id, spark_execution)
        self.spark_deploy_mode = check_deploy_mode(stage_id, spark_deploy_mode)
        self.allow_split_list_change = check_bool(
            stage_id, "allow_split_list_change", allow_split_list_change
        )
        scheduling.check_slices(stage_id, self.sinks, self.commit_mode)
        self.allow_empty = check_bool(stage_id, "allow_empty", allow_empty)
        self.on_drain = check_on_drain(self.stage_id, on_drain)
        self._spark: SparkSession | None = None

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        """``stage_id`` is serialized: the REST/CLI restore checks read the pipeline graph
        from Airflow's serialized DAG (a renamed stage keeps its task id, not its stage id);
        so are a fixed split list and ``allow_split_list_change``, for their split-list rules.
        """
        fields: frozenset[str] = super().get_serialized_fields()  # type: ignore[no-untyped-call]
        return frozenset(fields | {"stage_id", "fixed_splits", "allow_split_list_change"})

    # ------------------------------------------------------------------ graph and settings

    def _stage_tasks(self) -> dict[str, FinalCheckpointStageOperator]:
        return {t.task_id: t for t in self.dag.tasks if isinstance(t, FinalCheckpointStageOperator)}

    def pipeline_graph(self) -> StageGraph:
        """The pipeline graph: the DAG's stage tasks, edges between them, stable stage ids."""
        tasks = self._stage_tasks()
        return StageGraph.build(
            Stage(
                stage_id=t.stage_id,
                upstream=tuple(
                    sorted(tasks[u].stage_id for u in t.upstream_task_ids if u in tasks)
                ),
                task_id=t.task_id,
            )
            for t in tasks.values()
        )

    def resolve_template_files(self) -> None:
        """Airflow's DagBag calls this on every task once the DAG file built the whole DAG:
        the first stage task checks the pipeline's definition there (``operators/definition``),
        so a graph-level mistake is the DAG file's import error, not a task failure.
        """
        super().resolve_template_files()
        if self.has_dag():  # type: ignore[no-untyped-call]
            tasks = self._stage_tasks()
            if next(iter(tasks.values()), None) is self:
                check_pipeline_definition(tasks)

    def _upstream_stage_tasks(self) -> list[FinalCheckpointStageOperator]:
        tasks = self._stage_tasks()
        return [tasks[u] for u in sorted(self.upstream_task_ids) if u in tasks]

    def _resolve_key(self, context: Context, restored_key: str | None = None) -> ResolvedKey:
        """The conf's key, the operator's, a savepoint's, else the DAG run's own: the one it
        is linked to (a run linked before the keys changed keeps it), a new one for a run
        deleted and created again (``operators.run_keys``).
        """
        engine = self._hook().get_engine
        return resolve_key(context, self.dag_id, self.pipeline_key, restored_key, engine)

    def _hook(self) -> FinalCkptHook:
        return FinalCkptHook(finalckpt_conn_id=self.finalckpt_conn_id)

    # ------------------------------------------------------------------ execution

    @fail_permanent_errors
    def execute(self, context: Context) -> Any:
        """Run the stage's attempt (or park it, deferred, while it waits or is suspended)."""
        check_pipeline_definition(self._stage_tasks())  # a DAG the DagBag did not check
        hook = self._hook()
        settings = hook.get_settings()  # registers the store's credentials with the masker
        bind_sink_connections(self.sinks, self.log)  # conn_id sinks: now, never at parse time
        mask_task_secrets(None, self.sinks)
        storage = hook.get_storage()
        conf = (context["dag_run"].conf or {}) if context.get("dag_run") else {}
        restore_from = conf.get("restore_from")
        record = storage.read_checkpoint(str(restore_from)) if restore_from else None
        resolved = self._resolve_key(context, None if record is None else record.pipeline_key)
        key, self._key_origin = resolved.pipeline_key, resolved.origin
        coordinator: Coordinator = hook.get_coordinator(key)
        graph, self._pipeline_key = self.pipeline_graph(), key
        # the one graph-change check of every start from existing progress, before any write
        started = coordinator.start_pipeline(
            graph,
            options=coordinator_options(settings),
            record=record,
            source=str(restore_from) if restore_from else None,
            allow_drop_stages=parse_allow_drop_stages(conf.get(ALLOW_DROP_STAGES_KEY)),
            **drive_request(self.dag_id, context["run_id"], conf),
        )
        coordinator.link_dag_run(
            self.dag_id, context["run_id"], resolved.choice, instance=resolved.instance
        )
        if resolved.choice is not None and resolved.choice.replaces is not None:
            self.log.warning(
                "DAG run %s was deleted and created again (Airflow gave it the same run id): "
                "it works on %s pipeline %s, not on the deleted run's %s (docs/scheduling.md)",
                context["run_id"],
                "a new" if resolved.origin is KeyOrigin.DEFAULT else f"the {resolved.origin}'s",
                key,
                resolved.choice.replaces,
            )
        if (line := started.describe()) is not None:
            self.log.warning("pipeline %s: %s", key, line)
        log_resume_point(self.log, coordinator, self.stage_id)
        # clear or retry (core.rerun): a stage cleared after it succeeded is reset here
        prepare_attempt(coordinator, self.stage_id, self.sinks, context, self.log)
        # closed by an earlier DAG run: this attempt only re-publishes, no new Asset event
        self._republish = coordinator.closed_before_dag_run(
            self.stage_id, self.dag_id, context["run_id"]
        )

        upstream = [(up.task_id, up.stage_id) for up in self._upstream_stage_tasks()]
        manifests = upstream_manifests(context["ti"], self.stage_id, upstream)
        splits = scheduling.declared_splits(
            self, manifests, context, lambda source: self._claim(source, coordinator, context)
        )
        run = self._run_stage(context, key, coordinator, settings, storage, splits, manifests)
        result = run.result
        context["ti"].xcom_push(
            key=STAGE_RUN_KEY,
            value={
                "status": result.status.value,
                "epoch": run.epoch,
                "processed_splits": list(result.processed_splits),
                "skipped_splits": result.skipped_splits,
                "spark_started": run.spark_started,
            },
        )
        if result.status is RunStatus.SUSPENDED:
            return self._wait_for_resume(run.epoch, key, settings, result.savepoint_id)
        return self._wait_and_close(context, run.closer, key, settings)

    def _claim(self, source: Any, coordinator: Coordinator, context: Context) -> list[str]:
        """The range of an incremental source this pipeline run reads (docs/sources.md)."""
        return claim_splits(
            coordinator.engine,
            source,
            pipeline_key=coordinator.pipeline_key,
            stage_id=self.stage_id,
            run=scheduling.run_context_of(context),
            logger=self.log,
        )

    def _wait_for_resume(
        self, epoch: int | None, key: str, settings: Any, savepoint_id: int | None
    ) -> None:
        """Suspended by a stop with savepoint: release Spark, wait deferred (no worker slot)."""
        self.on_kill()  # releases this attempt's SparkSession, if it started one
        assert epoch is not None
        self.log.info(
            "stage %s is suspended at savepoint %s: Spark released, waiting for a resume "
            "(deferred, no worker slot)",
            self.stage_id,
            savepoint_id,
        )
        self.defer(
            trigger=StageResumeTrigger(
                pipeline_key=key,
                stage_id=self.stage_id,
                store_url=settings.store_url,
                poll_interval=max(self.poll_interval, 1.0),
                epoch=epoch,
                finalckpt_conn_id=self.finalckpt_conn_id,
            ),
            method_name="execute_resumed",
            kwargs={"pipeline_key": key, "epoch": epoch},
        )

    def execute_resumed(
        self,
        context: Context,
        event: Mapping[str, Any] | None = None,
        pipeline_key: str = "",
        epoch: int = 0,
    ) -> Any:
        """Back from a suspension: continue the stage from its durable progress (same run)."""
        event = self._expect_event(event, "resumed", f"the resume of pipeline {pipeline_key!r}")
        self.log.info(
            "pipeline %s %s: stage %s continues from its savepoint (attempt epoch was %d)",
            pipeline_key,
            "resumed" if event.get("reason") == "resumed" else f"goes on ({event.get('message')})",
            self.stage_id,
            epoch,
        )
        return self.execute(context)

    def _run_stage(
        self,
        context: Context,
        key: str,
        coordinator: Coordinator,
        settings: Any,
        storage: CheckpointStorage,
        splits: Sequence[str],
        manifests: Mapping[str, list[str]],
    ) -> StageRun:
        """Run this attempt's batches (or suspend, or skip a finished stage): in this process
        with a SparkSession from ``spark_master`` / the ``spark_conn_id`` connection (local,
        client mode or Spark Connect), or in a driver submitted through ``spark-submit``.
        """
        target = self._spark_target()
        job = self._stage_job(key, settings, splits, manifests, context)
        code = StageCode(self._transform(), self.on_finish, tuple(self.sinks), self.split_bytes)
        finished = coordinator.stage(self.stage_id).lifecycle.is_finished
        if target.mode is ExecutionMode.SUBMIT and not finished:
            return self._run_submitted(context, coordinator, settings, storage, job, code)
        runner = assemble_runner(
            coordinator, storage, job, code, spark_logic(self._spark_session), log=self.log
        )
        result = runner.run()
        return StageRun(
            result=result,
            epoch=runner.epoch,
            closer=runner.closer(),
            spark_started=bool(getattr(runner.logic, "spark_started", False)),
        )

    def _stage_job(
        self,
        key: str,
        settings: Any,
        splits: Sequence[str],
        manifests: Mapping[str, list[str]],
        context: Context,
    ) -> StageJob:
        """The attempt as plain values: the operator's arguments over ``[finalckpt]``."""
        interval = self.checkpoint_interval or settings.checkpoint_interval_s
        return StageJob(
            spec=StageSpec(
                pipeline_key=key,
                stage_id=self.stage_id,
                splits=tuple(splits),
                batch_size=self.batch_size,
                split_keys=self.split_keys,
                checkpoint_interval_s=float(interval),
                commit_mode=self.commit_mode,
                target_batch_s=self._target_batch_s(settings),
                attempt_lease_s=float(getattr(settings, "attempt_lease_s", 60)),
                on_drain=drain_behaviour(self, FinalCheckpointStageOperator),
                allow_split_list_change=self.allow_split_list_change,
                key_origin=str(getattr(self, "_key_origin", KeyOrigin.DEFAULT)),
            ),
            upstream_manifests=dict(manifests),
            hints_scope=hints_scope(self.dag_id),
            run=scheduling.run_context_of(context),
        )

    def _target_batch_s(self, settings: Any) -> float:
        if self.target_batch_s is not None:
            return float(self.target_batch_s)
        return float(getattr(settings, "target_batch_s", DEFAULT_TARGET_BATCH_S))

    def _closer(self, coordinator: Coordinator, epoch: int | None) -> StageCloser:
        """Commit and close need no Spark: commits are file renames and database transactions."""
        return StageCloser(coordinator, self.stage_id, self.sinks, epoch=epoch, log=self.log)

    def _wait_and_close(
        self, context: Context, closer: StageCloser, key: str, settings: Any
    ) -> Any:
        eod = closer.try_close()
        if eod is not None:
            return self._publish(context, eod, closer.coordinator)
        assert closer.epoch is not None
        self.log.info("stage %s waits for its final checkpoint (deferred)", self.stage_id)
        self.defer(
            trigger=FinalCheckpointTrigger(
                pipeline_key=key,
                stage_id=self.stage_id,
                store_url=settings.store_url,
                poll_interval=self.poll_interval,
                storage_uri=settings.storage_uri,
                storage_options=dict(settings.storage_options),
                epoch=closer.epoch,
                finalckpt_conn_id=self.finalckpt_conn_id,
            ),
            method_name="execute_complete",
            kwargs={"pipeline_key": key, "epoch": closer.epoch},
        )

    @fail_permanent_errors
    def execute_complete(
        self,
        context: Context,
        event: Mapping[str, Any] | None = None,
        pipeline_key: str = "",
        epoch: int = 0,
    ) -> Any:
        """Back from the triggerer: commit up to the final checkpoint, close, succeed."""
        event = self._expect_event(event, "closable", "the final checkpoint")
        bind_sink_connections(self.sinks, self.log)  # a new task process: resolved again
        coordinator = self._hook().get_coordinator(pipeline_key)
        eod = self._closer(coordinator, epoch).try_close()
        if eod is None:
            raise FinalCheckpointError(
                f"stage {self.stage_id!r}: checkpoint {event.get('checkpoint_id')} was reported "
                "closable but the stage cannot close"
            )
        return self._publish(context, eod, coordinator)

    def _expect_event(
        self, event: Mapping[str, Any] | None, status: str, waiting_for: str
    ) -> Mapping[str, Any]:
        """The trigger's event if it has the expected status; anything else (error, timeout,
        stale attempt) fails the task with the trigger's message.
        """
        event = event or {}
        if event.get("status") != status:
            raise FinalCheckpointError(
                f"stage {self.stage_id!r}: waiting for {waiting_for} ended with "
                f"{event.get('status')!r}: {event.get('message', event)}"
            )
        return event

    def _publish(
        self, context: Context, eod: EndOfData, coordinator: CoordinatorPort | None = None
    ) -> dict[str, Any]:
        republish = getattr(self, "_republish", False)
        doc = publish_end_of_data(context["ti"], self.stage_id, eod, self.log)
        # recorded once nothing but the success is left (a later try of this task in this DAG
        # run is then a clear), before the announcement: of two DAG runs returning one close
        # (a take-over), only the FIRST record announces it
        recorded = (
            None if coordinator is None else record_publication(coordinator, self.stage_id, context)
        )
        announce = not republish and recorded is not Publication.AGAIN
        if announce_commit(
            context, self.outlets, coordinator, self.stage_id, republish=not announce, log=self.log
        ):
            self.outlets = []  # Airflow emits the events of ti.task.outlets at success
        if coordinator is not None:
            scheduling.warn_repeated_dates(coordinator, self, context, republish=republish)
        return doc

    def _transform(self) -> Transform:
        if self.transform is None:
            raise StageDefinitionError(f"stage {self.stage_id!r} has no transform")
        return self.transform

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (Airflow's provider calls it on success): sink tables with schema and
        committed rows out, upstream stages' tables in.
        """
        return stage_lineage(self, task_instance)
