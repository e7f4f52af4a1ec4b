"""The checkpoint coordinator: FLIP-147's CheckpointCoordinator over a SQL store.

Every public method that changes state is one *transition*: one database transaction that first
locks the pipeline row, so any number of processes (Airflow workers, the triggerer, Spark drivers,
the API server) can drive one pipeline without lost or doubled transitions.

The rules it enforces (see DESIGN.md):

- a checkpoint's plan is computed atomically from the stages' live state; running stages answer
  at their next split-batch boundary (``record_batch``) or explicitly (``acknowledge``);
- a stage that finishes while a checkpoint waits for it acknowledges it with its final snapshot
  (never a hanging checkpoint), and finishing triggers an eager checkpoint at once;
- a finished stage may close on the first *completed* checkpoint whose id is >= the first
  checkpoint triggered after its finish (completions may arrive out of order: 42, 43, 44 pending,
  43 completes -> close on 43); while a stop-with-savepoint is in progress it waits for that
  exact savepoint, and if the savepoint is aborted the stop fails and the run goes on;
- every stage attempt holds an epoch; calls from a stale epoch raise StaleEpochError;
- a transaction is committable only once a completed checkpoint covers it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any

from sqlalchemy import Connection, Engine, RowMapping, Select, and_, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from airflow_finalckpt.core import observe
from airflow_finalckpt.core.errors import (
    CheckpointNotPendingError,
    DrainedSavepointError,
    IllegalTransitionError,
    StaleEpochError,
    StopRequestError,
    UnknownCheckpointError,
    UnknownPipelineError,
    UnknownStageError,
)
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.metadata.writer import CheckpointWriter
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    CheckpointState,
    EndOfData,
    SinkTransaction,
    StageCheckpointRecord,
    StageLifecycle,
    StageProgress,
    StageSnapshot,
    StageStatus,
    StateHandle,
    StopMode,
    StopState,
    TransactionState,
    TriggerReason,
)
from airflow_finalckpt.core.plan import CheckpointPlan, calculate_plan
from airflow_finalckpt.core.restore import (
    GraphChange,
    RestorePlan,
    StageAction,
    StageRestore,
    plan_graph_change,
    plan_restore,
)
from airflow_finalckpt.store import schema as t

log = logging.getLogger(__name__)


class AckOutcome(StrEnum):
    ACCEPTED = "accepted"
    COMPLETED = "completed"
    DUPLICATE = "duplicate"
    NOT_PENDING = "not_pending"


@dataclass(frozen=True)
class CheckpointInfo:
    checkpoint_id: int
    kind: CheckpointKind
    reason: TriggerReason
    state: CheckpointState
    plan: CheckpointPlan
    acks_pending: int
    triggered_at: float
    completed_at: float | None
    failure_reason: str | None
    metadata_path: str | None
    size_bytes: int | None

    @property
    def is_completed(self) -> bool:
        """Completed, even if since discarded by retention."""
        return self.completed_at is not None


@dataclass(frozen=True)
class StageView:
    stage_id: str
    lifecycle: StageLifecycle
    epoch: int
    total_splits: int | None
    progress: StageSnapshot
    finish_threshold: int | None
    final_snapshot: StageSnapshot | None
    closed_checkpoint_id: int | None


@dataclass(frozen=True)
class StopRequest:
    request_id: int
    mode: StopMode
    state: StopState
    savepoint_id: int | None
    requested_by: str | None
    requested_at: float
    finished_at: float | None
    failure_reason: str | None


@dataclass(frozen=True)
class BatchOutcome:
    """What a stage learns at a split-batch boundary."""

    acked: tuple[int, ...]
    completed: tuple[int, ...]
    stop: StopRequest | None


@dataclass(frozen=True)
class FinishOutcome:
    """``threshold``: the first checkpoint id triggered after finish; the stage closes on a
    completed checkpoint >= it. ``eager_checkpoint_id``: the checkpoint finishing triggered."""

    threshold: int
    eager_checkpoint_id: int | None
    end_of_data: EndOfData


@dataclass(frozen=True)
class CoordinatorOptions:
    retain_checkpoints: int = 3
    checkpoint_timeout_s: float = 600.0


@dataclass(frozen=True)
class StartOutcome:
    """What :meth:`Coordinator.start_pipeline` did: ``restored`` is the restore plan it applied
    (None: no ``restore_from``, or already restored from it), ``change`` the checked graph
    change of a continuation (None: the stored graph had the same fingerprint)."""

    restored: RestorePlan | None = None
    change: GraphChange | None = None

    def describe(self) -> str | None:
        """One line for the task log, None when nothing happened worth a line."""
        if self.restored is not None:
            return self.restored.describe()
        if self.change is not None:
            return self.change.describe()
        return None


@dataclass
class _Tx:
    conn: Connection
    pipeline: RowMapping
    after_commit: list[Callable[[], None]] = field(default_factory=list)


def suspends(stop: StopRequest | None) -> bool:
    """A stop with savepoint is in progress or completed (not resumed, not failed): no stage
    may start work or finish, and finished stages wait for the resume."""
    return (
        stop is not None
        and stop.mode is StopMode.SAVEPOINT
        and stop.state in (StopState.REQUESTED, StopState.COMPLETED)
    )


def draining(stop: StopRequest | None) -> bool:
    """A stop with drain is in progress: source stages stop taking splits."""
    return stop is not None and stop.mode is StopMode.DRAIN and stop.state is StopState.REQUESTED


@dataclass(frozen=True)
class WaitingStage:
    """One stage as its waiters see it (no progress JSON). ``first_completed_id``: the lowest
    completed checkpoint >= the finish threshold (what it may close on); ``first_candidate_id``:
    the lowest pending, completed or discarded one (a checkpoint in flight or done that can
    close it)."""

    stage_id: str
    lifecycle: StageLifecycle
    epoch: int
    finish_threshold: int | None
    closed_checkpoint_id: int | None
    first_completed_id: int | None
    first_candidate_id: int | None


@dataclass(frozen=True)
class PipelineSnapshot:
    """What every waiting stage of a pipeline decides on, read at once (a few statements,
    however many stages wait): the read model the triggers share (``waiting_snapshot``).

    Its answers only say whether a waiter has *nothing to do*: anything else (an event to fire,
    a checkpoint to abort or trigger) is decided again by the coordinator itself, so a stale
    snapshot can delay a waiter by one read but never make it fire wrongly.
    """

    pipeline_key: str
    checkpoint_timeout_s: float
    stages: Mapping[str, WaitingStage]
    stop: StopRequest | None
    #: (checkpoint_id, triggered_at) of every pending checkpoint.
    pending: tuple[tuple[int, float], ...]

    def timed_out(self, now: float) -> list[int]:
        """Pending checkpoints older than the checkpoint timeout (``expire_timed_out`` aborts
        them)."""
        deadline = now - self.checkpoint_timeout_s
        return [cid for cid, triggered_at in self.pending if triggered_at < deadline]

    def closable_checkpoint(self, stage_id: str) -> int | None:
        """As ``Coordinator.closable_checkpoint``; None also for a stage it does not know."""
        stage = self.stages.get(stage_id)
        if stage is None:
            return None
        if stage.lifecycle is StageLifecycle.CLOSED:
            return stage.closed_checkpoint_id
        if stage.lifecycle is not StageLifecycle.FINISHED:
            return None
        stop = self.stop
        if (
            stop is not None
            and stop.mode is StopMode.SAVEPOINT
            and stop.state is StopState.REQUESTED
        ):
            return None
        return stage.first_completed_id

    def final_checkpoint_work(self, stage_id: str, now: float) -> bool:
        """As ``Coordinator._final_checkpoint_work(expire=True)``: would
        ``ensure_final_checkpoint`` change anything (a timed-out checkpoint to abort, or a
        finished stage without a candidate checkpoint and no savepoint to wait for)?"""
        if self.timed_out(now):
            return True
        stage = self.stages.get(stage_id)
        if stage is None or stage.lifecycle is not StageLifecycle.FINISHED:
            return False
        return not suspends(self.stop) and stage.first_candidate_id is None

    def final_checkpoint_idle(self, stage_id: str, epoch: int | None, now: float) -> bool:
        """A finished stage waiting for its final checkpoint has nothing to do: the attempt is
        current, the stage FINISHED, nothing to close on and no write work for
        ``ensure_final_checkpoint``."""
        stage = self.stages.get(stage_id)
        return (
            stage is not None
            and (epoch is None or stage.epoch == epoch)
            and stage.lifecycle is StageLifecycle.FINISHED
            and self.closable_checkpoint(stage_id) is None
            and not self.final_checkpoint_work(stage_id, now)
        )

    def resume_idle(self, stage_id: str, epoch: int | None) -> bool:
        """A suspended stage keeps waiting: the attempt is current and a stop with savepoint is
        still in progress or completed (not resumed, failed or a drain)."""
        stage = self.stages.get(stage_id)
        return stage is not None and (epoch is None or stage.epoch == epoch) and suspends(self.stop)

    def closed_idle(self, stage_id: str) -> bool:
        """A stage someone waits to see CLOSED is known and not CLOSED yet."""
        stage = self.stages.get(stage_id)
        return stage is not None and stage.lifecycle is not StageLifecycle.CLOSED


def _snapshot(data: Any) -> StageSnapshot:
    return StageSnapshot.model_validate(data or {})


def _dump(model: StageSnapshot) -> dict[str, Any]:
    return model.model_dump(mode="json")


class Coordinator:
    """Coordinates the checkpoints of one pipeline (identified by its pipeline key)."""

    def __init__(
        self,
        engine: Engine,
        pipeline_key: str,
        *,
        writer: CheckpointWriter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.pipeline_key = pipeline_key
        # checkpoint storage; ``discard_checkpoint_dir`` / ``checkpoint_dir_ids`` are used only if
        # the writer has them (finishing interrupted discards, removing aborted leftovers)
        self.writer = writer
        self.clock = clock
        #: The parsed graph shape of the last fingerprint seen (the graph JSON is only read
        #: when the fingerprint changes, not in every transition).
        self._shape_cache: tuple[str, StageGraph] | None = None

    # ------------------------------------------------------------------ transactions

    @contextmanager
    def _transition(self, *, create: Mapping[str, Any] | None = None) -> Iterator[_Tx]:
        """One write transaction holding the pipeline lock; after-commit hooks run on success.
        ``create``: the pipeline row to insert first if there is none (rolled back with the
        rest if the transition raises)."""
        hooks: list[Callable[[], None]] = []
        with self.engine.begin() as conn:
            if create is not None:
                self._insert_ignore(conn, t.pipelines, create)
            # Every column but the graph (O(stages) of JSON): see _shape / _graph_data.
            row = (
                conn.execute(
                    select(*(c for c in t.pipelines.c if c.name != "graph"))
                    .where(t.pipelines.c.pipeline_key == self.pipeline_key)
                    .with_for_update()
                )
                .mappings()
                .first()
            )
            if row is None:
                raise UnknownPipelineError(
                    f"pipeline {self.pipeline_key!r} is not registered in the coordination store"
                )
            yield _Tx(conn, row, hooks)
        for hook in hooks:
            try:
                hook()
            except Exception:  # the transition committed; a failed cleanup must not undo it
                log.warning(
                    "after-commit hook of pipeline %r failed", self.pipeline_key, exc_info=True
                )

    def _graph_data(self, conn: Connection) -> dict[str, Any]:
        data = conn.execute(
            select(t.pipelines.c.graph).where(t.pipelines.c.pipeline_key == self.pipeline_key)
        ).scalar()
        if data is None:
            raise UnknownPipelineError(f"pipeline {self.pipeline_key!r} is not registered")
        return dict(data)

    def _shape(self, tx: _Tx) -> StageGraph:
        """The graph's shape (stage ids and edges), parsed once per fingerprint. The fingerprint
        is a hash of exactly that shape, so a cached graph with the same fingerprint plans the
        same checkpoints (task ids, which the fingerprint ignores, play no part in a plan)."""
        fingerprint = str(tx.pipeline["fingerprint"])
        cached = self._shape_cache
        if cached is None or cached[0] != fingerprint:
            graph = StageGraph.from_dict(self._graph_data(tx.conn))
            cached = (fingerprint, graph)
            self._shape_cache = cached
        return cached[1]

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn

    def _insert_ignore(self, conn: Connection, table: Any, values: Mapping[str, Any]) -> None:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        conn.execute(dialect.insert(table).values(**values).on_conflict_do_nothing())

    # ------------------------------------------------------------------ registration

    def register(self, graph: StageGraph, options: CoordinatorOptions | None = None) -> None:
        """Create the pipeline (idempotent) or move it to a changed graph, refusing (before any
        write) a change that would lose progress: see :meth:`start_pipeline`."""
        self.start_pipeline(graph, options=options)

    def start_pipeline(
        self,
        graph: StageGraph,
        *,
        options: CoordinatorOptions | None = None,
        record: CheckpointRecord | None = None,
        source: str | None = None,
        allow_drop_stages: Collection[str] = (),
    ) -> StartOutcome:
        """Start (or continue) the pipeline on ``graph``: the one entry every stage attempt
        goes through, so every start from existing progress runs the same graph-change check.

        In one transaction holding the pipeline lock, *before anything is written*:

        * ``record`` not yet restored from ``source`` (``restore_from``): the checkpoint's graph
          and statuses are checked against ``graph`` (:func:`plan_restore`), then every stage is
          reset to it;
        * otherwise, a stored graph whose fingerprint differs from ``graph``'s (a
          ``pipeline_key`` continuation or a retry after the DAG changed): the stored progress
          is checked (:func:`plan_graph_change`); stages it removes lose their rows only if they
          never started or are named in ``allow_drop_stages``;
        * the same fingerprint (a retry of the unchanged DAG, the run's other tasks): no check.

        Raises IllegalGraphChangeError / DrainedSavepointError / ForeignCheckpointError /
        MetadataError with the store unchanged (a new pipeline is not even created).
        """
        opts = options or CoordinatorOptions()
        now = self.clock()
        create = {
            "pipeline_key": self.pipeline_key,
            "graph": graph.to_dict(),
            "fingerprint": graph.fingerprint,
            "next_checkpoint_id": 1,
            "retain_checkpoints": opts.retain_checkpoints,
            "checkpoint_timeout_s": opts.checkpoint_timeout_s,
            "created_at": now,
            "updated_at": now,
        }
        with self._transition(create=create) as tx:
            plan: RestorePlan | None = None
            change: GraphChange | None = None
            if record is not None and tx.pipeline["restored_from"] != source:
                plan = plan_restore(
                    record,
                    graph,
                    pipeline_key=self.pipeline_key,
                    allow_drop_stages=allow_drop_stages,
                )
            elif tx.pipeline["fingerprint"] != graph.fingerprint:
                old = StageGraph.from_dict(self._graph_data(tx.conn))
                views = {sid: self._view(r) for sid, r in self._stage_rows(tx.conn).items()}
                progress = {
                    sid: StageProgress(
                        lifecycle=v.lifecycle,
                        finished_splits=v.progress.finished_splits,
                        total_splits=v.total_splits,
                    )
                    for sid, v in views.items()
                    if sid in old
                }
                change = plan_graph_change(
                    old,
                    progress,
                    graph,
                    pipeline_key=self.pipeline_key,
                    allow_drop_stages=allow_drop_stages,
                )
            # every check passed: from here on the transaction writes
            self._write_graph(tx, graph, opts, now)
            if plan is not None and record is not None:
                self._apply_restore(tx, plan, record, str(source), now)
            outcome = StartOutcome(restored=plan, change=change)
        if record is not None and source is not None:
            # Every start from a savepoint (each stage task, each attempt), not only the one
            # that applied the restore: no stage reads before the files are in place.
            self._materialize(record, source)
        return outcome

    def _materialize(self, record: CheckpointRecord, source: str) -> None:
        """Copy the files a self-contained savepoint holds into this pipeline's directory
        where they are missing (a savepoint directory copied alone to another cluster)."""
        materialize = getattr(self.writer, "materialize", None)
        if materialize is not None:
            materialize(record, source)

    def _write_graph(
        self, tx: _Tx, graph: StageGraph, opts: CoordinatorOptions, now: float
    ) -> None:
        tx.conn.execute(
            update(t.pipelines)
            .where(t.pipelines.c.pipeline_key == self.pipeline_key)
            .values(
                graph=graph.to_dict(),
                fingerprint=graph.fingerprint,
                retain_checkpoints=opts.retain_checkpoints,
                checkpoint_timeout_s=opts.checkpoint_timeout_s,
                updated_at=now,
            )
        )
        # Only stages the check allowed to go are still here: not started, or dropped on purpose.
        tx.conn.execute(
            t.stages.delete().where(
                t.stages.c.pipeline_key == self.pipeline_key,
                t.stages.c.stage_id.not_in(graph.stage_ids),
            )
        )
        for stage_id in graph.stage_ids:
            self._insert_ignore(
                tx.conn,
                t.stages,
                {
                    "pipeline_key": self.pipeline_key,
                    "stage_id": stage_id,
                    "lifecycle": StageLifecycle.NOT_STARTED.value,
                    "epoch": 0,
                    "progress": _dump(StageSnapshot()),
                    "updated_at": now,
                },
            )

    def link_dag_run(self, dag_id: str, run_id: str) -> None:
        """Record that an Airflow DAG run works on this pipeline (idempotent). A DAG run belongs
        to one pipeline: linking it to another one is refused."""
        with self.engine.begin() as conn:
            self._insert_ignore(
                conn,
                t.dag_runs,
                {
                    "dag_id": dag_id,
                    "run_id": run_id,
                    "pipeline_key": self.pipeline_key,
                    "created_at": self.clock(),
                },
            )
            owner = conn.execute(
                select(t.dag_runs.c.pipeline_key).where(
                    t.dag_runs.c.dag_id == dag_id, t.dag_runs.c.run_id == run_id
                )
            ).scalar_one()
        if owner != self.pipeline_key:
            raise IllegalTransitionError(
                f"DAG run {run_id!r} of DAG {dag_id!r} already works on pipeline {owner!r}, "
                f"not {self.pipeline_key!r} (a pipeline_key or restore_from in the conf of a "
                "running DAG run cannot change)"
            )

    def closed_before_dag_run(self, stage_id: str, dag_id: str, run_id: str) -> bool:
        """Whether the stage is CLOSED and its row was last changed before this DAG run joined
        the pipeline: its commit belongs to (and was announced by) an earlier DAG run, so this
        run only re-publishes its end_of_data. A stage closed within this DAG run (say by an
        attempt killed before Airflow recorded its success) is not: its commit is still news."""
        with self._read() as conn:
            row = conn.execute(
                select(t.stages.c.lifecycle, t.stages.c.updated_at).where(
                    t.stages.c.pipeline_key == self.pipeline_key,
                    t.stages.c.stage_id == stage_id,
                )
            ).first()
            linked = conn.execute(
                select(t.dag_runs.c.created_at).where(
                    t.dag_runs.c.dag_id == dag_id,
                    t.dag_runs.c.run_id == run_id,
                    t.dag_runs.c.pipeline_key == self.pipeline_key,
                )
            ).scalar()
        if row is None or linked is None:
            return False
        return row.lifecycle == StageLifecycle.CLOSED.value and float(row.updated_at) < float(
            linked
        )

    def dag_runs(self) -> list[tuple[str, str]]:
        """The (dag_id, run_id) pairs of the DAG runs this pipeline run spans, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                select(t.dag_runs.c.dag_id, t.dag_runs.c.run_id)
                .where(t.dag_runs.c.pipeline_key == self.pipeline_key)
                .order_by(t.dag_runs.c.created_at)
            ).all()
        return [(str(d), str(r)) for d, r in rows]

    def graph(self) -> StageGraph:
        with self._read() as conn:
            return StageGraph.from_dict(self._graph_data(conn))

    # ------------------------------------------------------------------ stage attempts

    def start_attempt(self, stage_id: str, *, total_splits: int | None = None) -> StageView:
        """Register a new attempt of a stage and return its view with the new epoch.

        The new attempt continues from the stage's durable progress; older attempts are fenced.
        A finished stage stays finished (the new attempt only waits for its final checkpoint).
        """
        with self._transition() as tx:
            row = self._stage_row(tx.conn, stage_id)
            lifecycle = StageLifecycle(row["lifecycle"])
            if lifecycle in (StageLifecycle.NOT_STARTED, StageLifecycle.SUSPENDED):
                # While a stop with savepoint is in progress or done, no stage starts work: a
                # new attempt (a downstream stage whose upstream closed on the savepoint, a
                # retry) begins suspended and waits for the resume.
                stop = self._latest_stop(tx.conn)
                lifecycle = (
                    StageLifecycle.SUSPENDED
                    if suspends(stop) and not self._awaiting(tx.conn, stage_id)
                    else StageLifecycle.RUNNING
                )
            values: dict[str, Any] = {
                "epoch": row["epoch"] + 1,
                "lifecycle": lifecycle.value,
                "updated_at": self.clock(),
            }
            if total_splits is not None:
                values["total_splits"] = total_splits
            self._update_stage(tx.conn, stage_id, values)
            return self._stage_view(tx.conn, stage_id)

    def batch_boundary(self, stage_id: str, epoch: int) -> StopRequest | None:
        """One cheap read before each split batch: StaleEpochError if a newer attempt took the
        stage over (a zombie stops before wasting Spark work), else the latest stop request."""
        with self._read() as conn:
            self._fence(self._stage_row(conn, stage_id), epoch)
            return self._latest_stop(conn)

    def check_epoch(self, stage_id: str, epoch: int) -> None:
        """Raise StaleEpochError unless ``epoch`` is the stage's current attempt."""
        with self._read() as conn:
            self._fence(self._stage_row(conn, stage_id), epoch)

    def _fence(self, row: RowMapping, epoch: int) -> None:
        if row["epoch"] != epoch:
            raise StaleEpochError(row["stage_id"], epoch, row["epoch"])

    # ------------------------------------------------------------------ checkpoints

    def trigger(
        self,
        reason: TriggerReason = TriggerReason.PERIODIC,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    ) -> int | None:
        """Trigger a checkpoint; None if none is due (periodic while one is pending, or the
        run is stopping with a savepoint / suspended / drained)."""
        with self._transition() as tx:
            self._expire(tx)
            stop = self._latest_stop(tx.conn)
            if stop is not None and (
                stop.state is StopState.COMPLETED
                or (stop.state is StopState.REQUESTED and stop.mode is StopMode.SAVEPOINT)
            ):
                return None
            if reason is TriggerReason.PERIODIC and self._pending_ids(tx.conn):
                return None
            return self._trigger(tx, kind, reason)

    def _trigger(self, tx: _Tx, kind: CheckpointKind, reason: TriggerReason) -> int:
        graph = self._shape(tx)
        rows = self._stage_rows(tx.conn)
        progress = {
            sid: StageProgress(
                lifecycle=StageLifecycle(r["lifecycle"]),
                finished_splits=_snapshot(r["progress"]).finished_splits,
                total_splits=r["total_splits"],
            )
            for sid, r in rows.items()
            if sid in graph
        }
        plan = calculate_plan(graph, progress)
        checkpoint_id = self._allocate_id(tx)
        tx.conn.execute(
            t.checkpoints.insert().values(
                pipeline_key=self.pipeline_key,
                checkpoint_id=checkpoint_id,
                kind=kind.value,
                reason=reason.value,
                state=CheckpointState.PENDING.value,
                plan=plan.to_dict(),
                acks_pending=len(plan.to_ack),
                triggered_at=self.clock(),
            )
        )
        # Finished, unclosed stages are covered by this checkpoint as FULLY_FINISHED: their
        # not-yet-covered transactions become committable once it completes.
        for sid in plan.fully_finished:
            if rows[sid]["lifecycle"] == StageLifecycle.FINISHED.value:
                self._stamp_transactions(tx.conn, sid, checkpoint_id)
        if not plan.to_ack:
            self._complete(tx, checkpoint_id)
        return checkpoint_id

    def _allocate_id(self, tx: _Tx) -> int:
        checkpoint_id = int(
            tx.conn.execute(
                select(t.pipelines.c.next_checkpoint_id).where(
                    t.pipelines.c.pipeline_key == self.pipeline_key
                )
            ).scalar_one()
        )
        tx.conn.execute(
            update(t.pipelines)
            .where(t.pipelines.c.pipeline_key == self.pipeline_key)
            .values(next_checkpoint_id=checkpoint_id + 1, updated_at=self.clock())
        )
        return checkpoint_id

    def acknowledge(
        self,
        checkpoint_id: int,
        stage_id: str,
        epoch: int,
        snapshot: StageSnapshot | None = None,
    ) -> AckOutcome:
        """Acknowledge a checkpoint with the stage's snapshot (default: its durable progress)."""
        with self._transition() as tx:
            row = self._stage_row(tx.conn, stage_id)
            self._fence(row, epoch)
            if snapshot is not None:
                self._update_stage(
                    tx.conn,
                    stage_id,
                    {
                        "progress": _dump(self._merge_progress(row, snapshot)),
                        "updated_at": self.clock(),
                    },
                )
                self._record_transactions(tx.conn, stage_id, epoch, snapshot.pending_transactions)
            return self._ack(tx, checkpoint_id, stage_id, epoch, by_finish=False)

    def _ack(
        self, tx: _Tx, checkpoint_id: int, stage_id: str, epoch: int, *, by_finish: bool
    ) -> AckOutcome:
        # Only the columns an ack needs: the whole plan (O(stages + finished splits) of JSON)
        # would make every ack O(graph).
        ck = self._checkpoint_row(
            tx.conn,
            checkpoint_id,
            t.checkpoints.c.state,
            t.checkpoints.c.acks_pending,
            t.checkpoints.c.triggered_at,
            t.checkpoints.c.plan["to_ack"].label("to_ack"),
        )
        if ck["state"] != CheckpointState.PENDING.value:
            return AckOutcome.NOT_PENDING
        if stage_id not in (ck["to_ack"] or ()):
            raise IllegalTransitionError(
                f"checkpoint {checkpoint_id} does not wait for stage {stage_id!r} "
                f"(it was not running when the checkpoint was triggered)"
            )
        exists = tx.conn.execute(
            select(t.acks.c.stage_id).where(
                t.acks.c.pipeline_key == self.pipeline_key,
                t.acks.c.checkpoint_id == checkpoint_id,
                t.acks.c.stage_id == stage_id,
            )
        ).first()
        if exists is not None:
            return AckOutcome.DUPLICATE
        newer = tx.conn.execute(
            select(func.max(t.acks.c.checkpoint_id)).where(
                t.acks.c.pipeline_key == self.pipeline_key, t.acks.c.stage_id == stage_id
            )
        ).scalar()
        if newer is None or newer < checkpoint_id:
            # Acked out of order (a newer one first): the newer checkpoint's snapshot does not
            # hold the new transactions, so they must not be stamped with this older id.
            self._stamp_transactions(tx.conn, stage_id, checkpoint_id)
        row = self._stage_row(tx.conn, stage_id)
        progress = _snapshot(row["progress"])
        snapshot = progress.model_copy(
            update={"pending_transactions": tuple(self._uncommitted(tx.conn, stage_id))}
        )
        acked_at = self.clock()
        tx.conn.execute(
            t.acks.insert().values(
                pipeline_key=self.pipeline_key,
                checkpoint_id=checkpoint_id,
                stage_id=stage_id,
                epoch=epoch,
                by_finish=by_finish,
                snapshot=_dump(snapshot),
                acked_at=acked_at,
            )
        )
        remaining = ck["acks_pending"] - 1
        event = observe.CheckpointAcknowledged(
            self.pipeline_key,
            checkpoint_id,
            stage_id,
            acked_at - float(ck["triggered_at"]),
            by_finish,
            remaining == 0,
        )
        tx.after_commit.append(partial(observe.notify, event))
        self._update_checkpoint(tx.conn, checkpoint_id, {"acks_pending": remaining})
        if remaining == 0 and self._complete(tx, checkpoint_id):
            return AckOutcome.COMPLETED
        return AckOutcome.ACCEPTED

    def record_batch(
        self,
        stage_id: str,
        epoch: int,
        *,
        finished_splits: Iterable[str] = (),
        state: Sequence[StateHandle] | None = None,
        transactions: Sequence[SinkTransaction] = (),
        watermark: int | None = None,
    ) -> BatchOutcome:
        """A split-batch boundary: make the batch's progress durable and answer every pending
        checkpoint that waits for this stage, in one transition."""
        with self._transition() as tx:
            row = self._stage_row(tx.conn, stage_id)
            self._fence(row, epoch)
            if row["lifecycle"] != StageLifecycle.RUNNING.value:
                raise IllegalTransitionError(
                    f"stage {stage_id!r} is {row['lifecycle']}, not RUNNING: it cannot record "
                    "split progress"
                )
            delta = StageSnapshot(
                finished_splits=frozenset(finished_splits),
                state=tuple(state) if state is not None else (),
                watermark=watermark,
            )
            merged = self._merge_progress(row, delta, replace_state=state is not None)
            self._update_stage(
                tx.conn, stage_id, {"progress": _dump(merged), "updated_at": self.clock()}
            )
            self._record_transactions(tx.conn, stage_id, epoch, transactions)
            acked: list[int] = []
            completed: list[int] = []
            for cid in self._awaiting(tx.conn, stage_id):
                outcome = self._ack(tx, cid, stage_id, epoch, by_finish=False)
                if outcome in (AckOutcome.ACCEPTED, AckOutcome.COMPLETED):
                    acked.append(cid)
                if outcome is AckOutcome.COMPLETED:
                    completed.append(cid)
            return BatchOutcome(tuple(acked), tuple(completed), self._latest_stop(tx.conn))

    def _merge_progress(
        self, row: RowMapping, delta: StageSnapshot, *, replace_state: bool = True
    ) -> StageSnapshot:
        current = _snapshot(row["progress"])
        watermarks = [w for w in (current.watermark, delta.watermark) if w is not None]
        return StageSnapshot(
            finished_splits=current.finished_splits | delta.finished_splits,
            state=delta.state if replace_state else current.state,
            watermark=max(watermarks) if watermarks else None,
            end_of_data=delta.end_of_data or current.end_of_data,
        )

    def decline(self, checkpoint_id: int, stage_id: str, epoch: int, reason: str) -> None:
        """A stage cannot take part in a checkpoint: abort it."""
        with self._transition() as tx:
            self._fence(self._stage_row(tx.conn, stage_id), epoch)
            ck = self._checkpoint_row(tx.conn, checkpoint_id)
            if ck["state"] != CheckpointState.PENDING.value:
                raise CheckpointNotPendingError(
                    f"checkpoint {checkpoint_id} is {ck['state']}, it cannot be declined"
                )
            self._abort(tx, checkpoint_id, f"declined by stage {stage_id!r}: {reason}")

    def abort(self, checkpoint_id: int, reason: str) -> bool:
        """Abort a pending checkpoint; False if it was no longer pending."""
        with self._transition() as tx:
            ck = self._checkpoint_row(tx.conn, checkpoint_id)
            if ck["state"] != CheckpointState.PENDING.value:
                return False
            self._abort(tx, checkpoint_id, reason)
            return True

    def expire_timed_out(self) -> list[int]:
        """Abort pending checkpoints older than the pipeline's checkpoint timeout."""
        with self._transition() as tx:
            return self._expire(tx)

    def _timed_out(self, timeout_s: float) -> Select[Any]:
        """Ids of this pipeline's PENDING checkpoints triggered more than ``timeout_s`` ago."""
        return select(t.checkpoints.c.checkpoint_id).where(
            t.checkpoints.c.pipeline_key == self.pipeline_key,
            t.checkpoints.c.state == CheckpointState.PENDING.value,
            t.checkpoints.c.triggered_at < self.clock() - timeout_s,
        )

    def _expire(self, tx: _Tx) -> list[int]:
        timeout_s = float(tx.pipeline["checkpoint_timeout_s"])
        expired = [int(cid) for cid in tx.conn.execute(self._timed_out(timeout_s)).scalars()]
        for cid in expired:
            self._abort(tx, cid, f"timed out after {tx.pipeline['checkpoint_timeout_s']:.0f} s")
        return expired

    def _abort(self, tx: _Tx, checkpoint_id: int, reason: str) -> None:
        self._update_checkpoint(
            tx.conn,
            checkpoint_id,
            {"state": CheckpointState.ABORTED.value, "failure_reason": reason},
        )
        event = observe.CheckpointAborted(self.pipeline_key, checkpoint_id, reason)
        tx.after_commit.append(partial(observe.notify, event))
        stop = self._latest_stop(tx.conn)
        if (
            stop is not None
            and stop.state is StopState.REQUESTED
            and stop.savepoint_id == checkpoint_id
        ):
            self._update_stop(
                tx.conn,
                stop.request_id,
                {
                    "state": StopState.FAILED.value,
                    "finished_at": self.clock(),
                    "failure_reason": f"savepoint {checkpoint_id} aborted: {reason}",
                },
            )

    def _complete(self, tx: _Tx, checkpoint_id: int) -> bool:
        """Complete a fully acknowledged checkpoint; False if writing its metadata failed."""
        ck = self._checkpoint_row(tx.conn, checkpoint_id)
        record = self._build_record(tx, ck)
        path: str | None = None
        size: int | None = None
        if self.writer is not None:
            try:
                # The id was never completed (this transition holds the pipeline lock), so a
                # chk-<id> directory already there is a leftover of a completion that failed or
                # was rolled back by a crash (the id was allocated again): replace it.
                path, size = self.writer.write_checkpoint(record, replace_orphan=True)
            except Exception as exc:  # storage failed: the checkpoint fails, the run goes on
                self._abort(tx, checkpoint_id, f"writing checkpoint metadata failed: {exc}")
                # What the failed write left (a complete-looking _metadata if the error came
                # after the rename, an empty directory) goes once the abort committed.
                tx.after_commit.append(partial(self._discard_leftover, checkpoint_id))
                return False
        now = self.clock()
        self._update_checkpoint(
            tx.conn,
            checkpoint_id,
            {
                "state": CheckpointState.COMPLETED.value,
                "completed_at": now,
                "metadata_path": path,
                "size_bytes": size,
            },
        )
        completed = observe.CheckpointCompleted(
            self.pipeline_key,
            checkpoint_id,
            record.kind.value,
            record.reason.value,
            now - record.triggered_at,
            size,
            sum(h.size for stage in record.stages.values() for h in stage.state),
            len(record.stages),
        )
        tx.after_commit.append(partial(observe.notify, completed))
        # Subsume: older pending checkpoints are obsolete (savepoints are never subsumed).
        for cid in tx.conn.execute(
            select(t.checkpoints.c.checkpoint_id).where(
                t.checkpoints.c.pipeline_key == self.pipeline_key,
                t.checkpoints.c.state == CheckpointState.PENDING.value,
                t.checkpoints.c.checkpoint_id < checkpoint_id,
                t.checkpoints.c.kind == CheckpointKind.CHECKPOINT.value,
            )
        ).scalars():
            self._abort(tx, int(cid), f"subsumed by checkpoint {checkpoint_id}")
        self._apply_retention(tx)
        stop = self._latest_stop(tx.conn)
        if (
            stop is not None
            and stop.state is StopState.REQUESTED
            and stop.savepoint_id == checkpoint_id
        ):
            self._update_stop(
                tx.conn, stop.request_id, {"state": StopState.COMPLETED.value, "finished_at": now}
            )
        return True

    def _apply_retention(self, tx: _Tx) -> None:
        retain = int(tx.pipeline["retain_checkpoints"])
        rows = tx.conn.execute(
            select(t.checkpoints.c.checkpoint_id, t.checkpoints.c.metadata_path)
            .where(
                t.checkpoints.c.pipeline_key == self.pipeline_key,
                t.checkpoints.c.state == CheckpointState.COMPLETED.value,
                t.checkpoints.c.kind == CheckpointKind.CHECKPOINT.value,
            )
            .order_by(t.checkpoints.c.checkpoint_id.desc())
        ).all()
        for cid, path in rows[retain:]:
            self._update_checkpoint(tx.conn, int(cid), {"state": CheckpointState.DISCARDED.value})
            if path and self.writer is not None:
                tx.after_commit.append(partial(self.writer.discard_checkpoint, str(path)))
        if self.writer is not None:
            # Every retention pass also finishes earlier discards that a crash or an I/O error
            # interrupted (nothing else would ever retry them).
            tx.after_commit.append(self._sweep_leftover_checkpoints)

    def _discard_leftover(self, checkpoint_id: int) -> None:
        """After commit: delete ``chk-<id>`` of a checkpoint that did not complete."""
        discard = getattr(self.writer, "discard_checkpoint_dir", None)
        if discard is not None:
            discard(self.pipeline_key, checkpoint_id)

    def _sweep_leftover_checkpoints(self) -> None:
        """After commit: delete the directories of ABORTED and DISCARDED checkpoints that
        checkpoint storage still holds (an interrupted discard, a failed completion).

        Both states are final, so no transition can need those files again; the states are read
        after the commit, outside the lock, and a PENDING checkpoint being written concurrently
        is never touched. Best effort: a failure is logged and retried at the next pass.
        """
        list_ids = getattr(self.writer, "checkpoint_dir_ids", None)
        discard = getattr(self.writer, "discard_checkpoint_dir", None)
        if list_ids is None or discard is None:
            return
        on_disk = list_ids(self.pipeline_key)
        if not on_disk:
            return
        with self._read() as conn:
            gone = sorted(
                int(cid)
                for cid in conn.execute(
                    select(t.checkpoints.c.checkpoint_id).where(
                        t.checkpoints.c.pipeline_key == self.pipeline_key,
                        t.checkpoints.c.checkpoint_id.in_(on_disk),
                        t.checkpoints.c.state.in_(
                            [CheckpointState.ABORTED.value, CheckpointState.DISCARDED.value]
                        ),
                    )
                ).scalars()
            )
        for cid in gone:
            try:
                discard(self.pipeline_key, cid)
            except Exception:
                log.warning(
                    "pipeline %r: cannot delete the directory of checkpoint %d (retried at the "
                    "next retention pass)",
                    self.pipeline_key,
                    cid,
                    exc_info=True,
                )
            else:
                log.info(
                    "pipeline %r: deleted the leftover directory of checkpoint %d",
                    self.pipeline_key,
                    cid,
                )

    def _build_record(self, tx: _Tx, ck: RowMapping) -> CheckpointRecord:
        checkpoint_id = int(ck["checkpoint_id"])
        plan = CheckpointPlan.from_dict(ck["plan"])
        acks = {
            r["stage_id"]: r
            for r in tx.conn.execute(
                select(t.acks).where(
                    t.acks.c.pipeline_key == self.pipeline_key,
                    t.acks.c.checkpoint_id == checkpoint_id,
                )
            ).mappings()
        }
        rows = self._stage_rows(tx.conn)
        stages: dict[str, StageCheckpointRecord] = {}
        for sid, status in plan.statuses.items():
            if sid in acks:
                snap = _snapshot(acks[sid]["snapshot"])
                if acks[sid]["by_finish"]:
                    status = StageStatus.FULLY_FINISHED
                elif snap.finished_splits:
                    status = StageStatus.PARTIALLY_FINISHED
                else:
                    status = StageStatus.RUNNING
            elif status is StageStatus.FULLY_FINISHED:
                final = _snapshot(rows[sid]["final_snapshot"])
                snap = final.model_copy(
                    update={"pending_transactions": tuple(self._uncommitted(tx.conn, sid))}
                )
            else:  # NOT_STARTED, or restored progress of a stage not yet started again
                snap = _snapshot(rows[sid]["progress"]) if sid in rows else StageSnapshot()
            if status is StageStatus.FULLY_FINISHED:
                stages[sid] = StageCheckpointRecord(
                    stage_id=sid,
                    status=status,
                    finished_splits=snap.finished_splits,
                    pending_transactions=snap.pending_transactions,
                    watermark=snap.watermark,
                    end_of_data=snap.end_of_data,
                )
            else:
                stages[sid] = StageCheckpointRecord(
                    stage_id=sid,
                    status=status,
                    finished_splits=snap.finished_splits,
                    state=snap.state,
                    pending_transactions=snap.pending_transactions,
                    watermark=snap.watermark,
                )
        return CheckpointRecord(
            pipeline_key=self.pipeline_key,
            checkpoint_id=checkpoint_id,
            kind=CheckpointKind(ck["kind"]),
            reason=TriggerReason(ck["reason"]),
            graph=self._graph_data(tx.conn),
            graph_fingerprint=tx.pipeline["fingerprint"],
            triggered_at=float(ck["triggered_at"]),
            completed_at=self.clock(),
            stages=stages,
        )

    # ------------------------------------------------------------------ finishing and closing

    def finish(self, stage_id: str, epoch: int, snapshot: StageSnapshot) -> FinishOutcome:
        """endInput() + finish(): record the final snapshot, acknowledge checkpoints waiting for
        the stage with it, and trigger the eager final checkpoint. Idempotent per attempt."""
        with self._transition() as tx:
            row = self._stage_row(tx.conn, stage_id)
            self._fence(row, epoch)
            lifecycle = StageLifecycle(row["lifecycle"])
            if lifecycle.is_finished:
                final = _snapshot(row["final_snapshot"])
                assert final.end_of_data is not None
                return FinishOutcome(int(row["finish_threshold"]), None, final.end_of_data)
            if lifecycle is not StageLifecycle.RUNNING:
                raise IllegalTransitionError(
                    f"stage {stage_id!r} is {lifecycle}, it cannot finish (start an attempt first)"
                )
            threshold = int(
                tx.conn.execute(
                    select(t.pipelines.c.next_checkpoint_id).where(
                        t.pipelines.c.pipeline_key == self.pipeline_key
                    )
                ).scalar_one()
            )
            eod = (snapshot.end_of_data or EndOfData()).model_copy(
                update={"finished_at_checkpoint": threshold}
            )
            merged = self._merge_progress(row, snapshot, replace_state=True)
            final = merged.model_copy(update={"end_of_data": eod, "pending_transactions": ()})
            self._record_transactions(tx.conn, stage_id, epoch, snapshot.pending_transactions)
            self._update_stage(
                tx.conn,
                stage_id,
                {
                    "lifecycle": StageLifecycle.FINISHED.value,
                    "finish_threshold": threshold,
                    "final_snapshot": _dump(final),
                    "progress": _dump(final),
                    "updated_at": self.clock(),
                },
            )
            for cid in self._awaiting(tx.conn, stage_id):
                self._ack(tx, cid, stage_id, epoch, by_finish=True)
            eager = self._eager_trigger(tx)
            return FinishOutcome(threshold, eager, eod)

    def _eager_trigger(self, tx: _Tx) -> int | None:
        stop = self._latest_stop(tx.conn)
        if suspends(stop):
            return None  # the stage waits for that exact savepoint
        if stop is not None and draining(stop):
            rows = self._stage_rows(tx.conn).values()
            if all(StageLifecycle(r["lifecycle"]).is_finished for r in rows):
                return self._trigger_after_stop_row(
                    tx, stop.request_id, CheckpointKind.DRAINED_SAVEPOINT
                )
        return self._trigger(tx, CheckpointKind.CHECKPOINT, TriggerReason.EAGER_FINAL)

    def closable_checkpoint(self, stage_id: str) -> int | None:
        """The checkpoint a finished stage may close on now, or None if it must keep waiting."""
        with self._read() as conn:
            row = self._stage_row(conn, stage_id)
            lifecycle = StageLifecycle(row["lifecycle"])
            if lifecycle is StageLifecycle.CLOSED:
                return int(row["closed_checkpoint_id"])
            if lifecycle is not StageLifecycle.FINISHED:
                return None
            stop = self._latest_stop(conn)
            if (
                stop is not None
                and stop.mode is StopMode.SAVEPOINT
                and (stop.state is StopState.REQUESTED)
            ):
                return None
            cid = conn.execute(
                select(func.min(t.checkpoints.c.checkpoint_id)).where(
                    t.checkpoints.c.pipeline_key == self.pipeline_key,
                    t.checkpoints.c.completed_at.is_not(None),
                    t.checkpoints.c.checkpoint_id >= row["finish_threshold"],
                )
            ).scalar()
            return None if cid is None else int(cid)

    def ensure_final_checkpoint(self, stage_id: str) -> int | None:
        """Make sure a finished stage has a checkpoint in flight that can close it.

        Called by whoever waits for the stage (its deferred trigger) on every poll, so a final
        checkpoint that was aborted (timeout, storage failure, failed savepoint) is replaced at
        once instead of waiting for the next periodic one. Returns the triggered id, if any.

        Read-only fast path: almost always a candidate is in flight and nothing timed out, so
        the write transition (the pipeline lock every other transition waits for) is taken
        only when a read shows it would change something; under the lock everything is
        checked again.
        """
        with self._read() as conn:
            if not self._final_checkpoint_work(conn, stage_id, expire=True):
                return None
        with self._transition() as tx:
            self._expire(tx)
            if not self._final_checkpoint_work(tx.conn, stage_id, expire=False):
                return None
            return self._eager_trigger(tx)

    def _checkpoint_timeout(self, conn: Connection) -> float:
        """The pipeline's checkpoint timeout; UnknownPipelineError if it is not registered."""
        timeout = conn.execute(
            select(t.pipelines.c.checkpoint_timeout_s).where(
                t.pipelines.c.pipeline_key == self.pipeline_key
            )
        ).scalar()
        if timeout is None:
            raise UnknownPipelineError(
                f"pipeline {self.pipeline_key!r} is not registered in the coordination store"
            )
        return float(timeout)

    def _final_checkpoint_work(self, conn: Connection, stage_id: str, *, expire: bool) -> bool:
        """Does ``ensure_final_checkpoint`` have anything to do: (``expire``) a pending
        checkpoint to time out, or a FINISHED stage without a checkpoint in flight or completed
        that can close it (and no stop with savepoint it must wait for)?"""
        if expire:
            timeout_s = float(self._checkpoint_timeout(conn))
            expired = conn.execute(self._timed_out(timeout_s).limit(1)).first()
            if expired is not None:
                return True
        row = (
            conn.execute(
                select(t.stages.c.lifecycle, t.stages.c.finish_threshold).where(
                    t.stages.c.pipeline_key == self.pipeline_key, t.stages.c.stage_id == stage_id
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            raise UnknownStageError(
                f"stage {stage_id!r} is not part of pipeline {self.pipeline_key!r}"
            )
        if row["lifecycle"] != StageLifecycle.FINISHED.value:
            return False
        stop = self._latest_stop(conn)
        if suspends(stop):
            return False
        candidate = conn.execute(
            select(t.checkpoints.c.checkpoint_id)
            .where(
                t.checkpoints.c.pipeline_key == self.pipeline_key,
                t.checkpoints.c.checkpoint_id >= int(row["finish_threshold"]),
                t.checkpoints.c.state.in_(
                    [
                        CheckpointState.PENDING.value,
                        CheckpointState.COMPLETED.value,
                        CheckpointState.DISCARDED.value,
                    ]
                ),
            )
            .limit(1)
        ).first()
        return candidate is None

    def committable_transactions(self, stage_id: str) -> list[SinkTransaction]:
        """Pre-committed transactions of the stage covered by a completed checkpoint."""
        with self._read() as conn:
            self._stage_row(conn, stage_id)
            latest = self._latest_completed_id(conn)
            if latest is None:
                return []
            return [
                txn
                for txn in self._uncommitted(conn, stage_id)
                if txn.checkpoint_id is not None and txn.checkpoint_id <= latest
            ]

    def mark_committed(self, stage_id: str, epoch: int, sink_id: str, txn_id: str) -> bool:
        """Record that the sink committed a transaction. False if it already was (no-op).

        Fenced: a stale attempt cannot record commits; a transaction not yet covered by a
        completed checkpoint cannot be committed.
        """
        with self._transition() as tx:
            self._fence(self._stage_row(tx.conn, stage_id), epoch)
            txn = self._txn_row(tx.conn, stage_id, sink_id, txn_id)
            if txn["state"] == TransactionState.COMMITTED.value:
                return False
            if txn["state"] == TransactionState.ABORTED.value:
                raise IllegalTransitionError(
                    f"transaction {txn_id!r} of sink {sink_id!r} was aborted; it cannot commit"
                )
            latest = self._latest_completed_id(tx.conn)
            if txn["checkpoint_id"] is None or latest is None or txn["checkpoint_id"] > latest:
                raise IllegalTransitionError(
                    f"transaction {txn_id!r} of sink {sink_id!r} is not covered by a completed "
                    "checkpoint yet; committing it now could duplicate data after a restore"
                )
            self._set_txn_state(tx.conn, stage_id, sink_id, txn_id, TransactionState.COMMITTED)
            return True

    def close(self, stage_id: str, epoch: int, checkpoint_id: int) -> list[SinkTransaction]:
        """close(): the stage's transactions up to ``checkpoint_id`` are committed; later ones
        are aborted (returned, so the caller aborts them in the sink); the stage is CLOSED."""
        with self._transition() as tx:
            row = self._stage_row(tx.conn, stage_id)
            self._fence(row, epoch)
            lifecycle = StageLifecycle(row["lifecycle"])
            if lifecycle is StageLifecycle.CLOSED:
                return []
            if lifecycle is not StageLifecycle.FINISHED:
                raise IllegalTransitionError(
                    f"stage {stage_id!r} is {lifecycle}; only a finished stage can close"
                )
            stop = self._latest_stop(tx.conn)
            if (
                stop is not None
                and stop.mode is StopMode.SAVEPOINT
                and stop.state is StopState.REQUESTED
            ):
                raise IllegalTransitionError(
                    f"stage {stage_id!r} cannot close while savepoint {stop.savepoint_id} is in "
                    "progress: it waits for that savepoint"
                )
            ck = self._checkpoint_row(tx.conn, checkpoint_id)
            if ck["completed_at"] is None or checkpoint_id < int(row["finish_threshold"]):
                raise IllegalTransitionError(
                    f"stage {stage_id!r} cannot close on checkpoint {checkpoint_id}: it needs a "
                    f"completed checkpoint >= {row['finish_threshold']} (its first checkpoint "
                    "after finish)"
                )
            uncommitted = self._uncommitted(tx.conn, stage_id)
            blocking = [
                x
                for x in uncommitted
                if x.checkpoint_id is not None and x.checkpoint_id <= checkpoint_id
            ]
            if blocking:
                raise IllegalTransitionError(
                    f"stage {stage_id!r} cannot close: transactions "
                    f"{sorted(x.txn_id for x in blocking)} are covered by checkpoint "
                    f"{checkpoint_id} but not committed yet"
                )
            for txn in uncommitted:
                self._set_txn_state(
                    tx.conn, stage_id, txn.sink_id, txn.txn_id, TransactionState.ABORTED
                )
            self._update_stage(
                tx.conn,
                stage_id,
                {
                    "lifecycle": StageLifecycle.CLOSED.value,
                    "closed_checkpoint_id": checkpoint_id,
                    "updated_at": self.clock(),
                },
            )
            if self.writer is not None:
                # A discard interrupted at the last completion would otherwise stay forever.
                tx.after_commit.append(self._sweep_leftover_checkpoints)
            return uncommitted

    def reset_stage(self, stage_id: str) -> StageView:
        """Forget a stage's progress so it recomputes (a cleared, committed stage on purpose).

        The epoch is bumped (fencing any running attempt); committed output stays committed.
        """
        with self._transition() as tx:
            row = self._stage_row(tx.conn, stage_id)
            for txn in self._uncommitted(tx.conn, stage_id):
                self._set_txn_state(
                    tx.conn, stage_id, txn.sink_id, txn.txn_id, TransactionState.ABORTED
                )
            self._update_stage(
                tx.conn,
                stage_id,
                {
                    "lifecycle": StageLifecycle.NOT_STARTED.value,
                    "epoch": row["epoch"] + 1,
                    "progress": _dump(StageSnapshot()),
                    "finish_threshold": None,
                    "final_snapshot": None,
                    "closed_checkpoint_id": None,
                    "updated_at": self.clock(),
                },
            )
            return self._stage_view(tx.conn, stage_id)

    # ------------------------------------------------------------------ restore

    def restore(self, plan: RestorePlan, record: CheckpointRecord, source: str) -> bool:
        """Reset every stage to a checkpoint or savepoint (``plan`` from ``plan_restore``).

        Fully finished stages become FINISHED and closable at once (their pending transactions
        are re-committed idempotently, their end_of_data re-published, no Spark job runs);
        partially finished ones keep their finished splits and state; the others start fresh.
        Works on an empty store too (the checkpoint is imported). Idempotent per ``source``:
        returns False if the pipeline was already restored from it.
        """
        with self._transition() as tx:
            if tx.pipeline["restored_from"] == source:
                return False
            self._apply_restore(tx, plan, record, source, self.clock())
        self._materialize(record, source)
        return True

    def _apply_restore(
        self, tx: _Tx, plan: RestorePlan, record: CheckpointRecord, source: str, now: float
    ) -> None:
        checkpoint_id = record.checkpoint_id
        for cid in self._pending_ids(tx.conn):
            self._abort(tx, cid, f"pipeline restored from {source}")
        stop = self._latest_stop(tx.conn)
        if stop is not None and stop.state is not StopState.RESUMED:
            self._update_stop(tx.conn, stop.request_id, {"state": StopState.RESUMED.value})
        exists = tx.conn.execute(
            select(t.checkpoints.c.state).where(
                t.checkpoints.c.pipeline_key == self.pipeline_key,
                t.checkpoints.c.checkpoint_id == checkpoint_id,
            )
        ).scalar()
        if exists is None:
            tx.conn.execute(
                t.checkpoints.insert().values(
                    pipeline_key=self.pipeline_key,
                    checkpoint_id=checkpoint_id,
                    kind=record.kind.value,
                    reason=record.reason.value,
                    state=CheckpointState.COMPLETED.value,
                    plan={
                        "to_trigger": [],
                        "to_ack": [],
                        "fully_finished": [],
                        "not_started": [],
                        "statuses": {k: v.status.value for k, v in record.stages.items()},
                    },
                    acks_pending=0,
                    triggered_at=record.triggered_at,
                    completed_at=record.completed_at,
                    metadata_path=source,
                )
            )
        next_id = max(int(tx.pipeline["next_checkpoint_id"]), checkpoint_id + 1)
        tx.conn.execute(
            update(t.pipelines)
            .where(t.pipelines.c.pipeline_key == self.pipeline_key)
            .values(next_checkpoint_id=next_id, restored_from=source, updated_at=now)
        )
        rows = self._stage_rows(tx.conn)
        for sid, decision in plan.stages.items():
            row = rows.get(sid)
            if row is None:
                raise UnknownStageError(
                    f"stage {sid!r} is not registered for pipeline {self.pipeline_key!r}; "
                    "register the current graph before restoring"
                )
            self._restore_stage(tx, row, decision, checkpoint_id, now)

    def _restore_stage(
        self,
        tx: _Tx,
        row: RowMapping,
        decision: StageRestore,
        checkpoint_id: int,
        now: float,
    ) -> None:
        sid = row["stage_id"]
        kept = {(x.sink_id, x.txn_id) for x in decision.pending_transactions}
        for txn in self._uncommitted(tx.conn, sid):
            if (txn.sink_id, txn.txn_id) not in kept:
                self._set_txn_state(tx.conn, sid, txn.sink_id, txn.txn_id, TransactionState.ABORTED)
        for txn in decision.pending_transactions:
            self._insert_ignore(
                tx.conn,
                t.transactions,
                {
                    "pipeline_key": self.pipeline_key,
                    "stage_id": sid,
                    "sink_id": txn.sink_id,
                    "txn_id": txn.txn_id,
                    "epoch": int(row["epoch"]) + 1,
                    "checkpoint_id": checkpoint_id,
                    "state": TransactionState.PRECOMMITTED.value,
                    "payload": txn.payload,
                    "updated_at": now,
                },
            )
            tx.conn.execute(
                update(t.transactions)
                .where(
                    t.transactions.c.pipeline_key == self.pipeline_key,
                    t.transactions.c.stage_id == sid,
                    t.transactions.c.sink_id == txn.sink_id,
                    t.transactions.c.txn_id == txn.txn_id,
                    t.transactions.c.state != TransactionState.COMMITTED.value,
                )
                .values(state=TransactionState.PRECOMMITTED.value, checkpoint_id=checkpoint_id)
            )
        snapshot = StageSnapshot(
            finished_splits=decision.finished_splits,
            state=decision.state,
            watermark=decision.watermark,
            end_of_data=decision.end_of_data if decision.action is StageAction.SKIP else None,
        )
        values: dict[str, Any] = {
            "epoch": int(row["epoch"]) + 1,
            "progress": _dump(snapshot),
            "closed_checkpoint_id": None,
            "updated_at": now,
        }
        if decision.action is StageAction.SKIP:
            values.update(
                lifecycle=StageLifecycle.FINISHED.value,
                finish_threshold=checkpoint_id,
                final_snapshot=_dump(snapshot.model_copy(update={"state": ()})),
            )
        else:
            values.update(
                lifecycle=StageLifecycle.NOT_STARTED.value,
                finish_threshold=None,
                final_snapshot=None,
            )
        self._update_stage(tx.conn, sid, values)

    def restored_from(self) -> str | None:
        with self._read() as conn:
            value = conn.execute(
                select(t.pipelines.c.restored_from).where(
                    t.pipelines.c.pipeline_key == self.pipeline_key
                )
            ).scalar()
        return None if value is None else str(value)

    # ------------------------------------------------------------------ stop and resume

    def request_stop(self, mode: StopMode, requested_by: str | None = None) -> StopRequest:
        """Stop with drain (finish everything, final drained savepoint) or with a savepoint
        (suspend without finishing). Refused while another stop runs or after the run ended."""
        with self._transition() as tx:
            self._expire(tx)
            stop = self._latest_stop(tx.conn)
            if stop is not None and stop.state is StopState.REQUESTED:
                raise StopRequestError(
                    f"pipeline {self.pipeline_key!r} is already stopping ({stop.mode} requested)"
                )
            if stop is not None and stop.state is StopState.COMPLETED:
                if stop.mode is StopMode.DRAIN:
                    raise StopRequestError(f"pipeline {self.pipeline_key!r} was already drained")
                raise StopRequestError(
                    f"pipeline {self.pipeline_key!r} is suspended at savepoint "
                    f"{stop.savepoint_id}; resume it first"
                )
            rows = self._stage_rows(tx.conn)
            if rows and all(r["lifecycle"] == StageLifecycle.CLOSED.value for r in rows.values()):
                raise StopRequestError(
                    f"pipeline {self.pipeline_key!r} has already finished: nothing to stop"
                )
            inserted = tx.conn.execute(
                t.stop_requests.insert().values(
                    pipeline_key=self.pipeline_key,
                    mode=mode.value,
                    state=StopState.REQUESTED.value,
                    requested_by=requested_by,
                    requested_at=self.clock(),
                )
            ).inserted_primary_key
            assert inserted is not None
            request_id = int(inserted[0])
            if mode is StopMode.SAVEPOINT:
                self._trigger_after_stop_row(tx, request_id, CheckpointKind.SAVEPOINT)
            elif all(StageLifecycle(r["lifecycle"]).is_finished for r in rows.values()):
                self._trigger_after_stop_row(tx, request_id, CheckpointKind.DRAINED_SAVEPOINT)
            stop = self._latest_stop(tx.conn)
            assert stop is not None
            return stop

    def _trigger_after_stop_row(self, tx: _Tx, request_id: int, kind: CheckpointKind) -> int:
        # Set savepoint_id before the trigger so an immediate completion finds the stop.
        reason = (
            TriggerReason.DRAIN
            if kind is CheckpointKind.DRAINED_SAVEPOINT
            else (TriggerReason.SAVEPOINT)
        )
        next_id = int(
            tx.conn.execute(
                select(t.pipelines.c.next_checkpoint_id).where(
                    t.pipelines.c.pipeline_key == self.pipeline_key
                )
            ).scalar_one()
        )
        self._set_stop_savepoint(tx, request_id, next_id)
        cid = self._trigger(tx, kind, reason)
        assert cid == next_id
        return cid

    def _set_stop_savepoint(self, tx: _Tx, request_id: int, checkpoint_id: int) -> None:
        self._update_stop(tx.conn, request_id, {"savepoint_id": checkpoint_id})
        ck = tx.conn.execute(
            select(t.checkpoints.c.state).where(
                t.checkpoints.c.pipeline_key == self.pipeline_key,
                t.checkpoints.c.checkpoint_id == checkpoint_id,
            )
        ).scalar()
        if ck == CheckpointState.COMPLETED.value:
            self._update_stop(
                tx.conn,
                request_id,
                {"state": StopState.COMPLETED.value, "finished_at": self.clock()},
            )

    def suspend(self, stage_id: str, epoch: int) -> None:
        """A running stage stopped at a batch boundary for a savepoint (no finish())."""
        with self._transition() as tx:
            row = self._stage_row(tx.conn, stage_id)
            self._fence(row, epoch)
            if not suspends(self._latest_stop(tx.conn)):
                raise IllegalTransitionError(
                    f"stage {stage_id!r} cannot suspend: no stop-with-savepoint is in progress"
                )
            if row["lifecycle"] == StageLifecycle.RUNNING.value:
                self._update_stage(
                    tx.conn,
                    stage_id,
                    {"lifecycle": StageLifecycle.SUSPENDED.value, "updated_at": self.clock()},
                )

    def resume(self, requested_by: str | None = None) -> StopRequest:
        """Continue a run suspended by a savepoint."""
        with self._transition() as tx:
            stop = self._latest_stop(tx.conn)
            if stop is None or stop.state in (StopState.FAILED, StopState.RESUMED):
                raise StopRequestError(f"pipeline {self.pipeline_key!r} is not suspended")
            if stop.mode is StopMode.DRAIN:
                if stop.state is StopState.COMPLETED:
                    raise DrainedSavepointError(
                        f"pipeline {self.pipeline_key!r} was drained at savepoint "
                        f"{stop.savepoint_id}: its windows already fired, it cannot be resumed"
                    )
                raise StopRequestError(f"pipeline {self.pipeline_key!r} is draining")
            if stop.state is StopState.REQUESTED:
                raise StopRequestError(
                    f"pipeline {self.pipeline_key!r}: savepoint {stop.savepoint_id} is still "
                    "in progress; resume after it completed"
                )
            self._update_stop(
                tx.conn,
                stop.request_id,
                {
                    "state": StopState.RESUMED.value,
                    "requested_by": requested_by or stop.requested_by,
                },
            )
            rows = self._stage_rows(tx.conn).values()
            if any(r["lifecycle"] == StageLifecycle.FINISHED.value for r in rows):
                # Stages that finished during the stop waited for the savepoint; give them a
                # checkpoint to close on now.
                self._trigger(tx, CheckpointKind.CHECKPOINT, TriggerReason.EAGER_FINAL)
            result = self._latest_stop(tx.conn)
            assert result is not None
            return result

    def stop_request(self) -> StopRequest | None:
        with self._read() as conn:
            return self._latest_stop(conn)

    # ------------------------------------------------------------------ queries

    def waiting_snapshot(self) -> PipelineSnapshot:
        """Everything waiting stages decide on, in one read transaction of four statements
        whatever the number of stages (a consistent snapshot: REPEATABLE READ on PostgreSQL,
        SQLite's read transaction). UnknownPipelineError if the pipeline is not registered."""
        s, c = t.stages, t.checkpoints

        def first(*where: Any) -> Any:
            """The lowest checkpoint id >= the stage's finish threshold matching ``where``
            (a correlated subquery: the database answers every stage in one statement)."""
            return (
                select(func.min(c.c.checkpoint_id))
                .where(
                    c.c.pipeline_key == s.c.pipeline_key,
                    s.c.lifecycle == StageLifecycle.FINISHED.value,
                    c.c.checkpoint_id >= s.c.finish_threshold,
                    *where,
                )
                .correlate(s)
                .scalar_subquery()
            )

        candidate_states = [
            CheckpointState.PENDING.value,
            CheckpointState.COMPLETED.value,
            CheckpointState.DISCARDED.value,
        ]
        with self._read() as conn:
            if conn.dialect.name == "postgresql":
                conn.execution_options(isolation_level="REPEATABLE READ")
            timeout = self._checkpoint_timeout(conn)
            rows = conn.execute(
                select(
                    s.c.stage_id,
                    s.c.lifecycle,
                    s.c.epoch,
                    s.c.finish_threshold,
                    s.c.closed_checkpoint_id,
                    first(c.c.completed_at.is_not(None)).label("first_completed_id"),
                    first(c.c.state.in_(candidate_states)).label("first_candidate_id"),
                ).where(s.c.pipeline_key == self.pipeline_key)
            ).all()
            pending = conn.execute(
                select(c.c.checkpoint_id, c.c.triggered_at)
                .where(
                    c.c.pipeline_key == self.pipeline_key,
                    c.c.state == CheckpointState.PENDING.value,
                )
                .order_by(c.c.checkpoint_id)
            ).all()
            stop = self._latest_stop(conn)
        return PipelineSnapshot(
            pipeline_key=self.pipeline_key,
            checkpoint_timeout_s=float(timeout),
            stages={
                r.stage_id: WaitingStage(
                    stage_id=r.stage_id,
                    lifecycle=StageLifecycle(r.lifecycle),
                    epoch=int(r.epoch),
                    finish_threshold=r.finish_threshold,
                    closed_checkpoint_id=r.closed_checkpoint_id,
                    first_completed_id=r.first_completed_id,
                    first_candidate_id=r.first_candidate_id,
                )
                for r in rows
            },
            stop=stop,
            pending=tuple((int(cid), float(at)) for cid, at in pending),
        )

    def stages(self) -> dict[str, StageView]:
        with self._read() as conn:
            return {sid: self._view(r) for sid, r in self._stage_rows(conn).items()}

    def stage(self, stage_id: str) -> StageView:
        with self._read() as conn:
            return self._stage_view(conn, stage_id)

    def checkpoints(self, *, limit: int | None = None) -> list[CheckpointInfo]:
        """Checkpoints, newest first."""
        query = (
            select(t.checkpoints)
            .where(t.checkpoints.c.pipeline_key == self.pipeline_key)
            .order_by(t.checkpoints.c.checkpoint_id.desc())
        )
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return [self._info(r) for r in conn.execute(query).mappings()]

    def checkpoint(self, checkpoint_id: int) -> CheckpointInfo:
        with self._read() as conn:
            return self._info(self._checkpoint_row(conn, checkpoint_id))

    def latest_completed(self, *, include_discarded: bool = False) -> CheckpointInfo | None:
        states = [CheckpointState.COMPLETED.value]
        if include_discarded:
            states.append(CheckpointState.DISCARDED.value)
        with self._read() as conn:
            row = (
                conn.execute(
                    select(t.checkpoints)
                    .where(
                        t.checkpoints.c.pipeline_key == self.pipeline_key,
                        t.checkpoints.c.state.in_(states),
                    )
                    .order_by(t.checkpoints.c.checkpoint_id.desc())
                    .limit(1)
                )
                .mappings()
                .first()
            )
        return None if row is None else self._info(row)

    def pending_for(self, stage_id: str) -> list[int]:
        """Pending checkpoints still waiting for this stage's acknowledgement."""
        with self._read() as conn:
            return self._awaiting(conn, stage_id)

    def transactions(self, stage_id: str | None = None) -> list[tuple[SinkTransaction, str]]:
        """All recorded transactions with their state (for inspection and tests)."""
        query = select(t.transactions).where(t.transactions.c.pipeline_key == self.pipeline_key)
        if stage_id is not None:
            query = query.where(t.transactions.c.stage_id == stage_id)
        with self._read() as conn:
            return [
                (self._txn(r), r["state"])
                for r in conn.execute(query.order_by(t.transactions.c.txn_id)).mappings()
            ]

    # ------------------------------------------------------------------ row helpers

    def _stage_rows(self, conn: Connection) -> dict[str, RowMapping]:
        return {
            r["stage_id"]: r
            for r in conn.execute(
                select(t.stages)
                .where(t.stages.c.pipeline_key == self.pipeline_key)
                .order_by(t.stages.c.stage_id)
            ).mappings()
        }

    def _stage_row(self, conn: Connection, stage_id: str) -> RowMapping:
        row = (
            conn.execute(
                select(t.stages).where(
                    t.stages.c.pipeline_key == self.pipeline_key, t.stages.c.stage_id == stage_id
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            raise UnknownStageError(
                f"stage {stage_id!r} is not part of pipeline {self.pipeline_key!r}"
            )
        return row

    def _stage_view(self, conn: Connection, stage_id: str) -> StageView:
        return self._view(self._stage_row(conn, stage_id))

    @staticmethod
    def _view(row: RowMapping) -> StageView:
        return StageView(
            stage_id=row["stage_id"],
            lifecycle=StageLifecycle(row["lifecycle"]),
            epoch=int(row["epoch"]),
            total_splits=row["total_splits"],
            progress=_snapshot(row["progress"]),
            finish_threshold=row["finish_threshold"],
            final_snapshot=None
            if row["final_snapshot"] is None
            else _snapshot(row["final_snapshot"]),
            closed_checkpoint_id=row["closed_checkpoint_id"],
        )

    def _update_stage(self, conn: Connection, stage_id: str, values: Mapping[str, Any]) -> None:
        conn.execute(
            update(t.stages)
            .where(t.stages.c.pipeline_key == self.pipeline_key, t.stages.c.stage_id == stage_id)
            .values(**values)
        )

    def _checkpoint_row(self, conn: Connection, checkpoint_id: int, *columns: Any) -> RowMapping:
        """The checkpoint's row (only ``columns`` if given); UnknownCheckpointError if none."""
        row = (
            conn.execute(
                select(*(columns or (t.checkpoints,))).where(
                    t.checkpoints.c.pipeline_key == self.pipeline_key,
                    t.checkpoints.c.checkpoint_id == checkpoint_id,
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            raise UnknownCheckpointError(
                f"pipeline {self.pipeline_key!r} has no checkpoint {checkpoint_id}"
            )
        return row

    @staticmethod
    def _info(row: RowMapping) -> CheckpointInfo:
        return CheckpointInfo(
            checkpoint_id=int(row["checkpoint_id"]),
            kind=CheckpointKind(row["kind"]),
            reason=TriggerReason(row["reason"]),
            state=CheckpointState(row["state"]),
            plan=CheckpointPlan.from_dict(row["plan"]),
            acks_pending=int(row["acks_pending"]),
            triggered_at=float(row["triggered_at"]),
            completed_at=row["completed_at"],
            failure_reason=row["failure_reason"],
            metadata_path=row["metadata_path"],
            size_bytes=row["size_bytes"],
        )

    def _update_checkpoint(
        self, conn: Connection, checkpoint_id: int, values: Mapping[str, Any]
    ) -> None:
        conn.execute(
            update(t.checkpoints)
            .where(
                t.checkpoints.c.pipeline_key == self.pipeline_key,
                t.checkpoints.c.checkpoint_id == checkpoint_id,
            )
            .values(**values)
        )

    def _pending_ids(self, conn: Connection) -> list[int]:
        return [
            int(c)
            for c in conn.execute(
                select(t.checkpoints.c.checkpoint_id)
                .where(
                    t.checkpoints.c.pipeline_key == self.pipeline_key,
                    t.checkpoints.c.state == CheckpointState.PENDING.value,
                )
                .order_by(t.checkpoints.c.checkpoint_id)
            ).scalars()
        ]

    def _awaiting(self, conn: Connection, stage_id: str) -> list[int]:
        """Pending checkpoints whose plan waits for ``stage_id`` and that it has not acked."""
        acked = select(t.acks.c.checkpoint_id).where(
            t.acks.c.pipeline_key == self.pipeline_key, t.acks.c.stage_id == stage_id
        )
        rows = conn.execute(
            select(t.checkpoints.c.checkpoint_id, t.checkpoints.c.plan["to_ack"])
            .where(
                t.checkpoints.c.pipeline_key == self.pipeline_key,
                t.checkpoints.c.state == CheckpointState.PENDING.value,
                t.checkpoints.c.checkpoint_id.not_in(acked),
            )
            .order_by(t.checkpoints.c.checkpoint_id)
        ).all()
        # Only the plan's to_ack list (the running stages) is read, not the whole plan.
        return [int(cid) for cid, to_ack in rows if stage_id in (to_ack or ())]

    def _latest_completed_id(self, conn: Connection) -> int | None:
        cid = conn.execute(
            select(func.max(t.checkpoints.c.checkpoint_id)).where(
                t.checkpoints.c.pipeline_key == self.pipeline_key,
                t.checkpoints.c.completed_at.is_not(None),
            )
        ).scalar()
        return None if cid is None else int(cid)

    # transactions

    @staticmethod
    def _txn(row: RowMapping) -> SinkTransaction:
        return SinkTransaction(
            sink_id=row["sink_id"],
            txn_id=row["txn_id"],
            checkpoint_id=row["checkpoint_id"],
            payload=row["payload"] or {},
        )

    def _record_transactions(
        self, conn: Connection, stage_id: str, epoch: int, txns: Sequence[SinkTransaction]
    ) -> None:
        for txn in txns:
            self._insert_ignore(
                conn,
                t.transactions,
                {
                    "pipeline_key": self.pipeline_key,
                    "stage_id": stage_id,
                    "sink_id": txn.sink_id,
                    "txn_id": txn.txn_id,
                    "epoch": epoch,
                    "checkpoint_id": None,
                    "state": TransactionState.PRECOMMITTED.value,
                    "payload": txn.payload,
                    "updated_at": self.clock(),
                },
            )

    def _stamp_transactions(self, conn: Connection, stage_id: str, checkpoint_id: int) -> None:
        conn.execute(
            update(t.transactions)
            .where(
                t.transactions.c.pipeline_key == self.pipeline_key,
                t.transactions.c.stage_id == stage_id,
                t.transactions.c.state == TransactionState.PRECOMMITTED.value,
                t.transactions.c.checkpoint_id.is_(None),
            )
            .values(checkpoint_id=checkpoint_id)
        )

    def _uncommitted(self, conn: Connection, stage_id: str) -> list[SinkTransaction]:
        return [
            self._txn(r)
            for r in conn.execute(
                select(t.transactions)
                .where(
                    t.transactions.c.pipeline_key == self.pipeline_key,
                    t.transactions.c.stage_id == stage_id,
                    t.transactions.c.state == TransactionState.PRECOMMITTED.value,
                )
                .order_by(t.transactions.c.sink_id, t.transactions.c.txn_id)
            ).mappings()
        ]

    def _txn_row(self, conn: Connection, stage_id: str, sink_id: str, txn_id: str) -> RowMapping:
        row = (
            conn.execute(
                select(t.transactions).where(
                    and_(
                        t.transactions.c.pipeline_key == self.pipeline_key,
                        t.transactions.c.stage_id == stage_id,
                        t.transactions.c.sink_id == sink_id,
                        t.transactions.c.txn_id == txn_id,
                    )
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            raise IllegalTransitionError(
                f"stage {stage_id!r} has no transaction {txn_id!r} for sink {sink_id!r}"
            )
        return row

    def _set_txn_state(
        self, conn: Connection, stage_id: str, sink_id: str, txn_id: str, state: TransactionState
    ) -> None:
        conn.execute(
            update(t.transactions)
            .where(
                t.transactions.c.pipeline_key == self.pipeline_key,
                t.transactions.c.stage_id == stage_id,
                t.transactions.c.sink_id == sink_id,
                t.transactions.c.txn_id == txn_id,
            )
            .values(state=state.value, updated_at=self.clock())
        )

    # stop requests

    def _latest_stop(self, conn: Connection) -> StopRequest | None:
        row = (
            conn.execute(
                select(t.stop_requests)
                .where(t.stop_requests.c.pipeline_key == self.pipeline_key)
                .order_by(t.stop_requests.c.request_id.desc())
                .limit(1)
            )
            .mappings()
            .first()
        )
        if row is None:
            return None
        return StopRequest(
            request_id=int(row["request_id"]),
            mode=StopMode(row["mode"]),
            state=StopState(row["state"]),
            savepoint_id=row["savepoint_id"],
            requested_by=row["requested_by"],
            requested_at=float(row["requested_at"]),
            finished_at=row["finished_at"],
            failure_reason=row["failure_reason"],
        )

    def _update_stop(self, conn: Connection, request_id: int, values: Mapping[str, Any]) -> None:
        conn.execute(
            update(t.stop_requests)
            .where(t.stop_requests.c.request_id == request_id)
            .values(**values)
        )
