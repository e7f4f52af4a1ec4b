"""What the people who press *stop* need: find a pipeline run from its DAG run, see its state,
stop it with drain or with a savepoint, resume it, and check a savepoint before a restore.

No Airflow and no Spark here: the caller authenticates and authorizes (REST/UI) or is an operator
with store credentials (CLI), and passes the user name along for the record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine

from airflow_finalckpt.control.split_lists import continuation_split_lists, restore_split_lists
from airflow_finalckpt.control.states import PipelineRunState, ended_at, run_state
from airflow_finalckpt.coordination import CheckpointInfo, Coordinator, StageView, StopRequest
from airflow_finalckpt.core.errors import (
    DrainedSavepointError,
    ForeignCheckpointError,
    StopRequestError,
    UnknownRunError,
)
from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    StageLifecycle,
    StageProgress,
    StageStatus,
    StopMode,
    StopState,
)
from airflow_finalckpt.core.plan import checkpoint_status
from airflow_finalckpt.core.restore import (
    GraphChange,
    RestorePlan,
    plan_document,
    plan_graph_change,
    plan_restore,
)
from airflow_finalckpt.core.run_conf import parse_allow_drop_stages
from airflow_finalckpt.core.split_list import DeclaredSplits
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.hints import read_batch_plan, read_batch_throughput
from airflow_finalckpt.store.listing import checkpoint_count, pipeline_times
from airflow_finalckpt.store.repository import (
    dag_ids_of,
    pipeline_keys_newest_first,
    pipeline_of_dag_run,
)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class StopSummary(_Model):
    """A stop request (drain or savepoint): who asked, when, and how far it got."""

    request_id: int
    mode: StopMode
    state: StopState
    savepoint_id: int | None
    savepoint_path: str | None = None
    requested_by: str | None
    requested_at: float
    finished_at: float | None
    failure_reason: str | None


class StageSummary(_Model):
    """One stage of a pipeline run, as the UI and ``finalckpt status`` show it."""

    stage_id: str
    upstream: list[str]
    lifecycle: StageLifecycle
    #: the status this stage would have in a checkpoint taken now
    status: StageStatus
    epoch: int
    done_splits: int
    total_splits: int | None
    closed_checkpoint_id: int | None
    #: set once the stage finished: was it drained, and how many input splits it left unread
    drained: bool | None = None
    unread_splits: int | None = None
    #: a running stage's latest split batch and measured throughput (auto batches)
    batches: str | None = None


class CheckpointSummary(_Model):
    """One checkpoint or savepoint of the run's history, with every stage's status in it."""

    checkpoint_id: int
    kind: CheckpointKind
    reason: str
    state: str
    triggered_at: float
    completed_at: float | None
    duration_s: float | None
    size_bytes: int | None
    metadata_path: str | None
    failure_reason: str | None
    stage_statuses: dict[str, StageStatus]
    #: why it was aborted (the detail is ``failure_reason``)
    failure_kind: CheckpointFailureReason | None = None


class PipelineRunSummary(_Model):
    """A pipeline run at a glance: its DAG runs, state, split totals and stop request."""

    pipeline_key: str
    dag_runs: list[tuple[str, str]]
    state: PipelineRunState
    stages_total: int
    stages_closed: int
    done_splits: int
    total_splits: int
    latest_checkpoint_id: int | None
    restored_from: str | None
    unread_splits: int
    stop: StopSummary | None
    #: when the pipeline run was registered, and when it stopped working (None while it runs)
    started_at: float | None = None
    ended_at: float | None = None


class PipelineDetail(_Model):
    """A pipeline run with its stages and its latest checkpoints (the run page)."""

    summary: PipelineRunSummary
    stages: list[StageSummary]
    checkpoints: list[CheckpointSummary]
    #: how many the history holds (``checkpoints`` are the newest of them)
    checkpoints_total: int = 0


def check_stages(
    record: CheckpointRecord, savepoint_path: str, dag_id: str, stage_ids: Collection[str]
) -> None:
    """ForeignCheckpointError if none of the savepoint's stages is a stage of the DAG."""
    if not set(record.stages) & set(stage_ids):
        raise ForeignCheckpointError(
            f"{savepoint_path} belongs to another pipeline: none of its stages "
            f"{sorted(record.stages)} is a stage of DAG {dag_id!r} ({sorted(stage_ids)})"
        )


#: The operator class whose tasks are pipeline stages (its ``task_type`` in a serialized DAG).
STAGE_TASK_TYPE = "FinalCheckpointStageOperator"


def dag_stage_graph(tasks: Iterable[Any]) -> StageGraph:
    """The pipeline graph of a DAG from its tasks (live operators or Airflow's serialized ones):
    the stage tasks, the edges between them, their stage ids. The operator serializes its
    ``stage_id``; a DAG serialized before it did falls back to the task id.
    """
    stages: dict[str, str] = {}
    upstream: dict[str, Collection[str]] = {}
    for task in tasks:
        stage_id = getattr(task, "stage_id", None)
        if stage_id is None and getattr(task, "task_type", None) != STAGE_TASK_TYPE:
            continue
        stages[task.task_id] = str(stage_id or task.task_id)
        upstream[task.task_id] = task.upstream_task_ids
    return StageGraph.build(
        Stage(
            stage_id=sid,
            upstream=tuple(sorted(stages[u] for u in upstream[task_id] if u in stages)),
            task_id=task_id,
        )
        for task_id, sid in stages.items()
    )


class RestoreCheck(_Model):
    """What a restore of a savepoint into a DAG will do, computed by the same functions the
    stage tasks run before they write anything (``Coordinator.start_pipeline``).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    savepoint_path: str
    pipeline_key: str
    checkpoint_id: int
    kind: CheckpointKind
    #: False when the DAG's graph was not asked for (``finalckpt restore --no-graph-check``):
    #: the stage tasks still check it before they write anything
    graph_checked: bool
    #: "restore" (reset to the savepoint) or "continue" (the store was already restored from
    #: this path: a new run continues the stored progress, the graph change checked against it)
    mode: str
    plan: dict[str, Any] | None
    allow_drop_stages: list[str]

    def lines(self) -> list[str]:
        """The dry run's human-readable answer."""
        head = (
            f"savepoint {self.checkpoint_id} of pipeline {self.pipeline_key!r} ({self.kind.value})"
        )
        if self.plan is None:
            return [
                f"{head}: the DAG's graph was NOT checked here (--no-graph-check); "
                "the graph-change rules are checked by the stage tasks before they write anything"
            ]
        out = [f"{head}: {self.plan['summary']}"]
        for stage in self.plan.get("stages", []):
            extra = ""
            if stage["state_files"]:
                extra += f", {stage['state_files']} state files ({stage['state_bytes']} B) mapped"
            if stage["pending_transactions"]:
                extra += f", {len(stage['pending_transactions'])} transactions re-committed"
            out.append(f"  {stage['stage_id']}: {stage['action']}: redo {stage['redo']}{extra}")
        for sid in self.plan.get("dropped_stages", []):
            out.append(f"  {sid}: progress DROPPED (allow_drop_stages)")
        for sid, note in self.plan.get("split_lists", {}).items():
            out.append(f"  {sid}: {note}")
        return out


def _change_document(change: GraphChange) -> dict[str, Any]:
    return {
        "kept": list(change.kept),
        "fresh": list(change.fresh),
        "dropped_stages": list(change.dropped),
        "forgotten": list(change.forgotten),
        "stages": [],
        "summary": change.describe(),
    }


def _stage_summary(view: StageView, graph: StageGraph) -> StageSummary:
    eod = view.final_snapshot.end_of_data if view.final_snapshot else None
    done = len(view.progress.finished_splits)
    if view.lifecycle.is_finished and view.total_splits is not None:
        done = view.total_splits - (eod.unread_splits if eod else 0)
    return StageSummary(
        stage_id=view.stage_id,
        upstream=list(graph.upstream(view.stage_id)) if view.stage_id in graph else [],
        lifecycle=view.lifecycle,
        status=checkpoint_status(
            StageProgress(
                lifecycle=view.lifecycle,
                finished_splits=view.progress.finished_splits,
                total_splits=view.total_splits,
            )
        ),
        epoch=view.epoch,
        done_splits=done,
        total_splits=view.total_splits,
        closed_checkpoint_id=view.closed_checkpoint_id,
        drained=eod.drain if eod else None,
        unread_splits=eod.unread_splits if eod else None,
    )


def _checkpoint_summary(info: CheckpointInfo) -> CheckpointSummary:
    done = info.completed_at
    return CheckpointSummary(
        checkpoint_id=info.checkpoint_id,
        kind=info.kind,
        reason=str(info.reason),
        state=str(info.state),
        triggered_at=info.triggered_at,
        completed_at=done,
        duration_s=None if done is None else max(0.0, done - info.triggered_at),
        size_bytes=info.size_bytes,
        metadata_path=info.metadata_path,
        failure_reason=info.failure_reason,
        failure_kind=info.failure_kind,
        stage_statuses=dict(info.plan.statuses),
    )


class PipelineControl:
    """Stop, resume and inspect pipeline runs by their Airflow DAG run."""

    def __init__(
        self,
        engine: Engine,
        storage: CheckpointStorage,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.storage = storage
        self.clock = clock

    # ------------------------------------------------------------------ lookup

    def resolve(self, dag_id: str, run_id: str) -> str:
        """The pipeline key of a DAG run; UnknownRunError if no stage task of it ran yet."""
        key = pipeline_of_dag_run(self.engine, dag_id, run_id)
        if key is None:
            raise UnknownRunError(
                f"no pipeline run is known for DAG run {run_id!r} of DAG {dag_id!r}: check the "
                "DAG id and run id (no stage task of that run has started yet?)"
            )
        return key

    def coordinator(self, pipeline_key: str) -> Coordinator:
        """The coordinator of one pipeline run, writing checkpoints to this storage."""
        return Coordinator(self.engine, pipeline_key, writer=self.storage, clock=self.clock)

    def dag_ids_of(self, pipeline_key: str) -> set[str]:
        """The DAGs whose runs ran this pipeline (empty on a store that never saw it)."""
        return dag_ids_of(self.engine, pipeline_key)

    # ------------------------------------------------------------------ status

    def runs(self, dag_id: str | None = None, *, limit: int = 100) -> list[PipelineRunSummary]:
        """Pipeline runs, newest first; only those of ``dag_id`` if given."""
        keys = pipeline_keys_newest_first(self.engine, dag_id)
        return [self.summary(key) for key in keys[:limit]]

    def summary(self, pipeline_key: str) -> PipelineRunSummary:
        """The summary of one pipeline run."""
        return self._summarize(self.coordinator(pipeline_key))[0]

    def _summarize(self, coordinator: Coordinator) -> tuple[PipelineRunSummary, list[StageSummary]]:
        """The run's summary and its stages in topological order, from one read of each."""
        graph = coordinator.graph()
        views = coordinator.stages()
        order = [sid for sid in graph.topological_order() if sid in views]
        stages = [_stage_summary(views[sid], graph) for sid in order]
        stop = coordinator.stop_request()
        latest = coordinator.latest_completed(include_discarded=True)
        state = run_state([v.lifecycle for v in views.values()], stop)
        started, changed = pipeline_times(self.engine, coordinator.pipeline_key)
        summary = PipelineRunSummary(
            pipeline_key=coordinator.pipeline_key,
            dag_runs=coordinator.dag_runs(),
            state=state,
            started_at=started,
            ended_at=ended_at(state, changed, stop),
            stages_total=len(views),
            stages_closed=sum(v.lifecycle is StageLifecycle.CLOSED for v in views.values()),
            done_splits=sum(s.done_splits for s in stages),
            total_splits=sum(s.total_splits or 0 for s in stages),
            latest_checkpoint_id=latest.checkpoint_id if latest else None,
            restored_from=coordinator.restored_from(),
            unread_splits=sum(s.unread_splits or 0 for s in stages if not s.upstream),
            stop=self._stop_summary(coordinator, stop),
        )
        return summary, stages

    def describe(self, dag_id: str, run_id: str, *, checkpoints: int = 50) -> PipelineDetail:
        """The detail of a DAG run's pipeline run; UnknownRunError if none is known."""
        return self.describe_pipeline(self.resolve(dag_id, run_id), checkpoints=checkpoints)

    def describe_pipeline(self, pipeline_key: str, *, checkpoints: int = 50) -> PipelineDetail:
        """Summary, stages (a running one with its latest batch) and the newest
        ``checkpoints`` checkpoints of a pipeline run.
        """
        coordinator = self.coordinator(pipeline_key)
        summary, stages = self._summarize(coordinator)
        stages = [self._with_batches(pipeline_key, stage) for stage in stages]
        return PipelineDetail(
            summary=summary,
            stages=stages,
            checkpoints=[
                _checkpoint_summary(c) for c in coordinator.checkpoints(limit=checkpoints)
            ],
            checkpoints_total=checkpoint_count(self.engine, pipeline_key),
        )

    def _with_batches(self, pipeline_key: str, stage: StageSummary) -> StageSummary:
        """A running (or suspended) stage with its latest batch and measured throughput."""
        if stage.lifecycle not in (StageLifecycle.RUNNING, StageLifecycle.SUSPENDED):
            return stage
        measured = read_batch_throughput(self.storage, pipeline_key, stage.stage_id)
        plan = read_batch_plan(self.storage, pipeline_key, stage.stage_id)
        texts = [plan, measured.describe() if measured else None]
        return stage.model_copy(update={"batches": "; ".join(t for t in texts if t) or None})

    def _stop_summary(
        self, coordinator: Coordinator, stop: StopRequest | None
    ) -> StopSummary | None:
        if stop is None:
            return None
        path = None  # kept after a resume: the savepoint stays restorable
        if stop.savepoint_id is not None and stop.state in (StopState.COMPLETED, StopState.RESUMED):
            path = coordinator.checkpoint(stop.savepoint_id).metadata_path
        return StopSummary(
            request_id=stop.request_id,
            mode=stop.mode,
            state=stop.state,
            savepoint_id=stop.savepoint_id,
            savepoint_path=path,
            requested_by=stop.requested_by,
            requested_at=stop.requested_at,
            finished_at=stop.finished_at,
            failure_reason=stop.failure_reason,
        )

    def drain_note(self, dag_id: str, run_id: str) -> str | None:
        """The DAG run note of a drained run: who drained it, the final savepoint and how much
        input was left unread; None if the run was not drained.
        """
        try:
            key = self.resolve(dag_id, run_id)
        except UnknownRunError:
            return None
        summary, stages = self._summarize(self.coordinator(key))
        stop = summary.stop
        if stop is None or stop.mode is not StopMode.DRAIN or stop.state is not StopState.COMPLETED:
            return None
        sources = [s for s in stages if not s.upstream and s.total_splits]
        read = ", ".join(
            f"{s.stage_id} {(s.total_splits or 0) - (s.unread_splits or 0)}/{s.total_splits}"
            for s in sources
        )
        by = f" by {stop.requested_by}" if stop.requested_by else ""
        return (
            f"Drained{by}: stopped taking input and published everything read so far at "
            f"drained savepoint {stop.savepoint_id}. {summary.unread_splits} input splits were "
            f"left unread (splits read: {read or 'none'}). A drained run cannot be resumed."
        )

    # ------------------------------------------------------------------ changes

    def stop(
        self, dag_id: str, run_id: str, mode: StopMode, requested_by: str | None = None
    ) -> StopSummary:
        """Stop with drain or with a savepoint. StopRequestError if the run already finished,
        is already stopping, is suspended or was drained.
        """
        coordinator = self.coordinator(self.resolve(dag_id, run_id))
        stop = coordinator.request_stop(StopMode(mode), requested_by=requested_by)
        summary = self._stop_summary(coordinator, stop)
        assert summary is not None
        return summary

    def resume(self, dag_id: str, run_id: str, requested_by: str | None = None) -> StopSummary:
        """Resume a run suspended at a savepoint (in the same DAG run). A drained run is
        refused with DrainedSavepointError.
        """
        coordinator = self.coordinator(self.resolve(dag_id, run_id))
        stop = coordinator.resume(requested_by=requested_by)
        summary = self._stop_summary(coordinator, stop)
        assert summary is not None
        return summary

    def wait_for_stop(
        self,
        dag_id: str,
        run_id: str,
        *,
        timeout_s: float,
        poll_s: float = 0.5,
        on_poll: Callable[[StopSummary], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> StopSummary:
        """Wait until the latest stop request is no longer REQUESTED (completed or failed)."""
        coordinator = self.coordinator(self.resolve(dag_id, run_id))
        deadline = time.monotonic() + timeout_s
        while True:
            coordinator.expire_timed_out()
            summary = self._stop_summary(coordinator, coordinator.stop_request())
            if summary is None:
                raise StopRequestError(f"DAG run {run_id!r} of DAG {dag_id!r} has no stop request")
            if on_poll is not None:
                on_poll(summary)
            if summary.state is not StopState.REQUESTED:
                return summary
            if time.monotonic() >= deadline:
                raise StopRequestError(
                    f"the {summary.mode} stop of DAG run {run_id!r} did not complete within "
                    f"{timeout_s:g} s (savepoint {summary.savepoint_id} still in progress; it "
                    "completes at the running stages' next split-batch boundary)"
                )
            sleep(poll_s)

    # ------------------------------------------------------------------ restore

    def check_restore(
        self,
        dag_id: str,
        savepoint_path: str,
        *,
        stage_ids: Collection[str] | None = None,
    ) -> CheckpointRecord:
        """Read and vet a savepoint before a new DAG run of ``dag_id`` restores it.

        Refused: unreadable / corrupt / newer metadata (MetadataError, StorageError), a drained
        savepoint (DrainedSavepointError), a savepoint of a pipeline that ran under another DAG,
        or one none of whose stages exists in the DAG's ``stage_ids`` (ForeignCheckpointError).
        Graph changes are checked in detail by the restore planner when the run starts.
        """
        record = self.storage.read_checkpoint(savepoint_path)
        if record.kind is CheckpointKind.DRAINED_SAVEPOINT:
            raise DrainedSavepointError(
                f"{savepoint_path} is a drained savepoint (checkpoint {record.checkpoint_id} of "
                f"pipeline {record.pipeline_key!r}): its windows already fired, it cannot be "
                "restored"
            )
        owners = self.dag_ids_of(record.pipeline_key)
        if owners and dag_id not in owners:
            raise ForeignCheckpointError(
                f"{savepoint_path} belongs to pipeline {record.pipeline_key!r} of DAG "
                f"{', '.join(sorted(owners))}, not of DAG {dag_id!r}"
            )
        if stage_ids is not None:
            check_stages(record, savepoint_path, dag_id, stage_ids)
        return record

    def plan_restore(
        self,
        dag_id: str,
        savepoint_path: str,
        load_graph: Callable[[str], StageGraph | None],
        *,
        allow_drop_stages: Collection[str] = (),
        load_splits: Callable[[str], Mapping[str, DeclaredSplits]] | None = None,
    ) -> RestoreCheck:
        """Vet a savepoint (:meth:`check_restore`), then, with the DAG's graph from
        ``load_graph(dag_id)`` (None: not available here), plan the restore exactly as the
        stage tasks will: IllegalGraphChangeError (naming the stage and the rule) for a change
        they would refuse; with the DAG's split lists from ``load_splits(dag_id)``, the
        split-list rules too (``control.split_lists``: SplitListChangedError or
        LostFinishedSplitsError, as the task would raise). The savepoint is read once; nothing
        is written.
        """
        drop = list(parse_allow_drop_stages(list(allow_drop_stages)))  # the tasks' own parsing
        record = self.check_restore(dag_id, savepoint_path)
        graph = load_graph(dag_id)
        common: dict[str, Any] = {
            "savepoint_path": savepoint_path,
            "pipeline_key": record.pipeline_key,
            "checkpoint_id": record.checkpoint_id,
            "kind": record.kind,
            "allow_drop_stages": drop,
        }
        if graph is None:
            return RestoreCheck(**common, graph_checked=False, mode="restore", plan=None)
        check_stages(record, savepoint_path, dag_id, graph.stage_ids)
        coordinator = self.coordinator(record.pipeline_key)
        declared = {} if load_splits is None else load_splits(dag_id)
        if coordinator.restored_from() == savepoint_path:
            change = self._plan_continuation(coordinator, graph, drop)
            notes = continuation_split_lists(coordinator, declared, "its last attempt")
            document = {**_change_document(change), "split_lists": notes}
            return RestoreCheck(**common, graph_checked=True, mode="continue", plan=document)
        plan: RestorePlan = plan_restore(
            record, graph, pipeline_key=record.pipeline_key, allow_drop_stages=drop
        )
        notes = restore_split_lists(record, declared, f"checkpoint {savepoint_path}")
        document = {**plan_document(plan), "split_lists": notes}
        return RestoreCheck(**common, graph_checked=True, mode="restore", plan=document)

    @staticmethod
    def _plan_continuation(
        coordinator: Coordinator, graph: StageGraph, drop: Collection[str]
    ) -> GraphChange:
        old = coordinator.graph()
        progress = {
            sid: StageProgress(
                lifecycle=v.lifecycle,
                finished_splits=v.progress.finished_splits,
                total_splits=v.total_splits,
            )
            for sid, v in coordinator.stages().items()
            if sid in old
        }
        return plan_graph_change(
            old, progress, graph, pipeline_key=coordinator.pipeline_key, allow_drop_stages=drop
        )
