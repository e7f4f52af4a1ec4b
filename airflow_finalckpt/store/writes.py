"""Every write of one pipeline's coordination rows, inside the locked transition
(``CoordinationStore.transition``): what a transition decided, put into rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from sqlalchemy import Connection, bindparam, select, union_all, update

from airflow_finalckpt.core.errors import UnknownStageError
from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    CheckpointState,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    StopMode,
    StopState,
    TransactionState,
    TriggerReason,
)
from airflow_finalckpt.core.partitions import SUPERSEDED, counts
from airflow_finalckpt.core.plan import CheckpointPlan
from airflow_finalckpt.core.transitions_boundary import BoundaryAcks
from airflow_finalckpt.core.views import CoordinatorOptions, StageChange, StageRow, StopRequest
from airflow_finalckpt.store import boundary as b
from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.reads import StoreReader

# The hot path's statements (every acknowledgement runs them), built once and executed with
# bound values: SQLAlchemy caches their compiled form by statement, and building a statement
# cost more than running it. An UPDATE without ``values`` sets the columns its parameters
# name (the ``b_`` ones are the WHERE clause's).
_UPDATE_STAGE = update(t.stages).where(
    t.stages.c.pipeline_key == bindparam("b_key"), t.stages.c.stage_id == bindparam("b_stage")
)
_UPDATE_LEASE = update(t.stages).where(
    t.stages.c.pipeline_key == bindparam("b_key"),
    t.stages.c.stage_id == bindparam("b_stage"),
    t.stages.c.epoch == bindparam("b_epoch"),
    t.stages.c.lifecycle == StageLifecycle.RUNNING.value,
)
_UPDATE_CHECKPOINT = update(t.checkpoints).where(
    t.checkpoints.c.pipeline_key == bindparam("b_key"),
    t.checkpoints.c.checkpoint_id == bindparam("b_cid"),
)
_DELETE_DUE = t.acks_due.delete().where(
    t.acks_due.c.pipeline_key == bindparam("b_key"),
    t.acks_due.c.checkpoint_id == bindparam("b_cid"),
    t.acks_due.c.stage_id == bindparam("b_stage"),
)
#: PostgreSQL: the acknowledgement, its acks_due row's delete and the count of acknowledgements
#: still pending in one statement (data-modifying CTEs always run to completion).
_INSERT_ACK_DUE_DONE = b.INSERT_ACK.add_cte(_DELETE_DUE.cte("done_due")).add_cte(
    update(t.checkpoints)
    .where(
        t.checkpoints.c.pipeline_key == bindparam("b_key"),
        t.checkpoints.c.checkpoint_id == bindparam("b_cid"),
    )
    .values(acks_pending=bindparam("b_remaining"))
    .cte("counted")
)
#: PostgreSQL: ``boundary.STAMP`` and the stage's uncommitted transactions after it in one
#: statement. The outer query sees the rows as they were before it (a data-modifying CTE's
#: changes are not visible to it), so the rows stamped now come from the CTE's RETURNING, the
#: others from the table.
_STAMPED = b.STAMP.returning(*t.transactions.c).cte("stamped")
_STAMP_AND_READ = union_all(
    select(*t.transactions.c).where(
        t.transactions.c.pipeline_key == bindparam("b_key"),
        t.transactions.c.stage_id == bindparam("b_stage"),
        t.transactions.c.state == TransactionState.PRECOMMITTED.value,
        t.transactions.c.checkpoint_id.is_not(None),
    ),
    select(*_STAMPED.c),
).order_by("sink_id", "txn_id")
#: The pipeline lock: its row (every column but the graph) FOR UPDATE.
LOCK_PIPELINE = (
    select(*(c for c in t.pipelines.c if c.name != "graph"))
    .where(t.pipelines.c.pipeline_key == bindparam("b_key"))
    .with_for_update()
)


class _Unread(Enum):
    """Marks the cached latest stop request as not read yet."""

    UNREAD = "unread"


_UNREAD = _Unread.UNREAD


def write_lease(conn: Connection, key: str, stage_id: str, epoch: int, until: float) -> bool:
    """Set the attempt lease of a RUNNING stage's attempt ``epoch`` (renewed, or set in the past
    when the attempt fails); False if that attempt is not the stage's running one any more. A
    single-row update that needs no pipeline lock: whoever decides on the lease holds the lock
    and reads it then, and an answer given for an attempt that renews afterwards is still the
    snapshot of its last batch boundary.
    """
    params = {"b_key": key, "b_stage": stage_id, "b_epoch": epoch, "lease_until": until}
    return bool(conn.execute(_UPDATE_LEASE, params).rowcount)


class StoreWriter(StoreReader):
    """Reads and writes of one pipeline's rows within its locked transition; ``pipeline`` is
    the locked pipeline row (every column but the graph).
    """

    def __init__(self, conn: Connection, pipeline_key: str, pipeline: Mapping[str, Any]) -> None:
        super().__init__(conn, pipeline_key)
        self.pipeline = pipeline
        #: A boundary read taken with the lock: (stage id, read), see ``boundary``.
        self.prefetched: tuple[str, b.BoundaryRead] | None = None
        #: The latest stop request as last read in this transition (``_UNREAD``: read it). The
        #: pipeline is locked, so only this transition's ``insert_stop`` / ``update_stop`` can
        #: change it; they forget it.
        self._stop: StopRequest | _Unread | None = _UNREAD

    def latest_stop(self) -> StopRequest | None:
        """The newest stop request (read once per transition until a stop is written)."""
        if isinstance(self._stop, _Unread):
            self._stop = super().latest_stop()
        return self._stop

    def boundary(
        self, stage_id: str, batch: Sequence[SinkTransaction]
    ) -> tuple[StageRow, b.BoundaryRead]:
        """What a split-batch boundary decides on, in one statement (``store.boundary``); the
        stop read is kept for ``latest_stop``. UnknownStageError as ``stage_row``.
        """
        read = None
        if self.prefetched is not None and self.prefetched[0] == stage_id:
            read = self.prefetched[1]  # the batch is the one the transition was opened with
        else:
            read = b.read_boundary(self.conn, self.key, stage_id, batch)
        if read is None:
            raise UnknownStageError(f"stage {stage_id!r} is not part of pipeline {self.key!r}")
        self._stop = b.stop_of(read.row)
        return r.stage_row(read.row), read

    def write_boundary(
        self,
        stage_id: str,
        epoch: int,
        change: StageChange,
        acks: BoundaryAcks,
        snapshot: StageSnapshot | None,
        now: float,
    ) -> None:
        """A boundary's stage change, new transactions and acknowledgements (each recording
        ``snapshot``), as decided.
        """
        values = r.stage_values(change, now)
        recorded = None if snapshot is None else r.dump(snapshot)
        b.write_boundary(self.conn, self.key, stage_id, epoch, values, acks, recorded, now)

    @property
    def fingerprint(self) -> str:
        """The stored graph's fingerprint."""
        return str(self.pipeline["fingerprint"])

    @property
    def restored_source(self) -> str | None:
        """``restored_from`` as locked (the savepoint a restore already applied)."""
        value = self.pipeline["restored_from"]
        return None if value is None else str(value)

    @property
    def timeout_s(self) -> float:
        """The checkpoint timeout as locked."""
        return float(self.pipeline["checkpoint_timeout_s"])

    @property
    def retain(self) -> int:
        """How many completed checkpoints retention keeps."""
        return int(self.pipeline["retain_checkpoints"])

    # ------------------------------------------------------------------ pipeline

    def write_graph(self, graph: StageGraph, opts: CoordinatorOptions, now: float) -> None:
        """Store ``graph`` and options; drop stages it no longer has, add its new ones."""
        self._update_pipeline(
            graph=graph.to_dict(),
            fingerprint=graph.fingerprint,
            retain_checkpoints=opts.retain_checkpoints,
            checkpoint_timeout_s=opts.checkpoint_timeout_s,
            updated_at=now,
        )
        # Only stages the check allowed to go are still here: not started, or dropped on purpose.
        self.conn.execute(
            t.stages.delete().where(
                t.stages.c.pipeline_key == self.key,
                t.stages.c.stage_id.not_in(graph.stage_ids),
            )
        )
        for stage_id in graph.stage_ids:
            r.insert_ignore(
                self.conn,
                t.stages,
                {
                    "pipeline_key": self.key,
                    "stage_id": stage_id,
                    "lifecycle": StageLifecycle.NOT_STARTED.value,
                    "epoch": 0,
                    "progress": r.dump(StageSnapshot()),
                    "updated_at": now,
                },
            )

    def allocate_id(self, now: float) -> int:
        """Take the next checkpoint id."""
        checkpoint_id = self.next_checkpoint_id()
        self._update_pipeline(next_checkpoint_id=checkpoint_id + 1, updated_at=now)
        return checkpoint_id

    def mark_restored(self, source: str, next_id: int, now: float) -> None:
        """Record the restore source and move the id counter past the restored checkpoint."""
        self._update_pipeline(next_checkpoint_id=next_id, restored_from=source, updated_at=now)

    @property
    def driver(self) -> tuple[str, str] | None:
        """(dag_id, run_id) of the DAG run driving the pipeline, as locked (None: none yet)."""
        dag_id, run_id = self.pipeline.get("driver_dag_id"), self.pipeline.get("driver_run_id")
        return None if dag_id is None or run_id is None else (str(dag_id), str(run_id))

    def set_driver(self, dag_id: str, run_id: str) -> None:
        """Record the DAG run that drives the pipeline from now on."""
        self._update_pipeline(driver_dag_id=dag_id, driver_run_id=run_id)

    def _update_pipeline(self, **values: Any) -> None:
        self.conn.execute(
            update(t.pipelines).where(t.pipelines.c.pipeline_key == self.key).values(**values)
        )

    @property
    def next_id_locked(self) -> int:
        """``next_checkpoint_id`` as locked (before this transition allocated any)."""
        return int(self.pipeline["next_checkpoint_id"])

    # ------------------------------------------------------------------ stages

    def update_stage(self, stage_id: str, change: StageChange, now: float) -> None:
        """Write a stage change."""
        values = r.stage_values(change, now)
        self.conn.execute(_UPDATE_STAGE, {**values, "b_key": self.key, "b_stage": stage_id})

    def forget_published(self, stage_id: str) -> None:
        """A reset stage was published by nobody (``core.rerun``): its next close is new."""
        self.conn.execute(
            _UPDATE_STAGE.values(published_by=None), {"b_key": self.key, "b_stage": stage_id}
        )

    def set_lease(self, stage_id: str, epoch: int, until: float) -> bool:
        """See ``write_lease``."""
        return write_lease(self.conn, self.key, stage_id, epoch, until)

    # ------------------------------------------------------------------ checkpoints

    def insert_checkpoint(
        self,
        checkpoint_id: int,
        kind: CheckpointKind,
        reason: TriggerReason,
        plan: CheckpointPlan,
        now: float,
    ) -> None:
        """A new pending checkpoint."""
        self.conn.execute(
            t.checkpoints.insert().values(
                pipeline_key=self.key,
                checkpoint_id=checkpoint_id,
                kind=kind.value,
                reason=reason.value,
                state=CheckpointState.PENDING.value,
                plan=plan.to_dict(splits=False),
                acks_pending=len(plan.to_ack),
                triggered_at=now,
            )
        )
        if plan.to_ack:
            self.conn.execute(
                t.acks_due.insert(),
                [
                    {"pipeline_key": self.key, "checkpoint_id": checkpoint_id, "stage_id": sid}
                    for sid in plan.to_ack
                ],
            )

    def import_checkpoint(self, record: CheckpointRecord, source: str) -> None:
        """A completed checkpoint restored from ``source`` that this store never saw."""
        self.conn.execute(
            t.checkpoints.insert().values(
                pipeline_key=self.key,
                checkpoint_id=record.checkpoint_id,
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

    def _update_checkpoint(self, checkpoint_id: int, values: Mapping[str, Any]) -> None:
        self.conn.execute(_UPDATE_CHECKPOINT, {**values, "b_key": self.key, "b_cid": checkpoint_id})

    def _forget_due(self, checkpoint_id: int) -> None:
        """A checkpoint that is no longer pending waits for nobody."""
        due = t.acks_due.c
        self.conn.execute(
            t.acks_due.delete().where(
                due.pipeline_key == self.key, due.checkpoint_id == checkpoint_id
            )
        )

    def mark_aborted(self, checkpoint_id: int, kind: CheckpointFailureReason, detail: str) -> None:
        """ABORTED, with its cause and detail."""
        self._forget_due(checkpoint_id)
        self._update_checkpoint(
            checkpoint_id,
            {
                "state": CheckpointState.ABORTED.value,
                "failure_kind": kind.value,
                "failure_reason": detail,
            },
        )

    def mark_completed(
        self, checkpoint_id: int, now: float, path: str | None, size: int | None
    ) -> None:
        """COMPLETED, with where its metadata is."""
        self._forget_due(checkpoint_id)
        self._update_checkpoint(
            checkpoint_id,
            {
                "state": CheckpointState.COMPLETED.value,
                "completed_at": now,
                "metadata_path": path,
                "size_bytes": size,
            },
        )

    def mark_discarded(self, checkpoint_id: int) -> None:
        """DISCARDED by retention."""
        self._update_checkpoint(checkpoint_id, {"state": CheckpointState.DISCARDED.value})

    def record_ack(
        self,
        checkpoint_id: int,
        stage_id: str,
        epoch: int,
        by_finish: bool,
        snapshot: StageSnapshot,
        now: float,
        *,
        remaining: int | None,
    ) -> None:
        """Record an acknowledgement; ``remaining``: the checkpoint waited for the stage, it no
        longer does (its ``finalckpt_acks_due`` row goes) and waits for that many more (None: a
        finish joined it, nobody waited). On PostgreSQL one statement (the delete and the count
        as data-modifying CTEs: one round trip instead of three), else three.
        """
        params = {
            "b_key": self.key,
            "b_cid": checkpoint_id,
            "b_stage": stage_id,
            "b_epoch": epoch,
            "b_by_finish": by_finish,
            "b_snapshot": r.dump(snapshot),
            "b_acked_at": now,
        }
        if remaining is None:
            self.conn.execute(b.INSERT_ACK, params)
        elif self.conn.dialect.name == "postgresql":
            self.conn.execute(_INSERT_ACK_DUE_DONE, {**params, "b_remaining": remaining})
        else:
            self.conn.execute(b.INSERT_ACK, params)
            self.conn.execute(_DELETE_DUE, params)
            self._update_checkpoint(checkpoint_id, {"acks_pending": remaining})

    # ------------------------------------------------------------------ transactions

    def record_transactions(
        self, stage_id: str, epoch: int, txns: Sequence[SinkTransaction], now: float
    ) -> None:
        """Pre-committed transactions, not yet covered (idempotent per id), in one statement."""
        if not txns:
            return
        self.conn.execute(
            r.insert_ignore_statement(self.conn, t.transactions),
            [
                {
                    "pipeline_key": self.key,
                    "stage_id": stage_id,
                    "sink_id": txn.sink_id,
                    "txn_id": txn.txn_id,
                    "epoch": epoch,
                    "checkpoint_id": None,
                    "state": TransactionState.PRECOMMITTED.value,
                    "payload": txn.payload,
                    "updated_at": now,
                }
                for txn in txns
            ],
        )

    def stamp_transactions(self, stage_id: str, checkpoint_id: int) -> None:
        """The stage's uncovered pre-committed transactions are covered by ``checkpoint_id``."""
        params = {"b_key": self.key, "b_stage": stage_id, "b_stamp": checkpoint_id}
        self.conn.execute(b.STAMP, params)

    def stamp_and_read_uncommitted(
        self, stage_id: str, checkpoint_id: int | None
    ) -> list[SinkTransaction]:
        """``stamp_transactions`` (unless ``checkpoint_id`` is None) then ``uncommitted``: what
        an acknowledgement records; one round trip on PostgreSQL.
        """
        if checkpoint_id is None:
            return self.uncommitted(stage_id)
        if self.conn.dialect.name != "postgresql":
            self.stamp_transactions(stage_id, checkpoint_id)
            return self.uncommitted(stage_id)
        params = {"b_key": self.key, "b_stage": stage_id, "b_stamp": checkpoint_id}
        rows = self.conn.execute(_STAMP_AND_READ, params).mappings()
        return [r.sink_transaction(row) for row in rows]

    def stamp_stages_transactions(self, stage_ids: Sequence[str], checkpoint_id: int) -> None:
        """``stamp_transactions`` of several stages in one statement (what a trigger covers)."""
        if not stage_ids:
            return
        self.conn.execute(
            update(t.transactions)
            .where(
                t.transactions.c.pipeline_key == self.key,
                t.transactions.c.stage_id.in_(stage_ids),
                t.transactions.c.state == TransactionState.PRECOMMITTED.value,
                t.transactions.c.checkpoint_id.is_(None),
            )
            .values(checkpoint_id=checkpoint_id)
        )

    def set_transaction_state(
        self, stage_id: str, sink_id: str, txn_id: str, state: TransactionState, now: float
    ) -> None:
        """Move one transaction to ``state``."""
        self.conn.execute(
            update(t.transactions)
            .where(
                t.transactions.c.pipeline_key == self.key,
                t.transactions.c.stage_id == stage_id,
                t.transactions.c.sink_id == sink_id,
                t.transactions.c.txn_id == txn_id,
            )
            .values(state=state.value, updated_at=now)
        )

    def supersede_committed(self, stage_id: str, now: float) -> None:
        """The stage's committed transactions no longer count for its next commit (a reset:
        ``core.partitions.SUPERSEDED`` in their payload; they stay COMMITTED, so a replayed
        commit is still a no-op).
        """
        for txn, state in self.transactions(stage_id):
            if not counts(txn, state):
                continue
            self.conn.execute(
                update(t.transactions)
                .where(
                    t.transactions.c.pipeline_key == self.key,
                    t.transactions.c.stage_id == stage_id,
                    t.transactions.c.sink_id == txn.sink_id,
                    t.transactions.c.txn_id == txn.txn_id,
                )
                .values(payload={**txn.payload, SUPERSEDED: True}, updated_at=now)
            )

    def restore_transaction(
        self, stage_id: str, txn: SinkTransaction, epoch: int, checkpoint_id: int, now: float
    ) -> None:
        """A transaction a restored checkpoint holds: pre-committed and covered by it again
        (inserted if this store never saw it; a committed one stays committed).
        """
        r.insert_ignore(
            self.conn,
            t.transactions,
            {
                "pipeline_key": self.key,
                "stage_id": stage_id,
                "sink_id": txn.sink_id,
                "txn_id": txn.txn_id,
                "epoch": epoch,
                "checkpoint_id": checkpoint_id,
                "state": TransactionState.PRECOMMITTED.value,
                "payload": txn.payload,
                "updated_at": now,
            },
        )
        self.conn.execute(
            update(t.transactions)
            .where(
                t.transactions.c.pipeline_key == self.key,
                t.transactions.c.stage_id == stage_id,
                t.transactions.c.sink_id == txn.sink_id,
                t.transactions.c.txn_id == txn.txn_id,
                t.transactions.c.state != TransactionState.COMMITTED.value,
            )
            .values(state=TransactionState.PRECOMMITTED.value, checkpoint_id=checkpoint_id)
        )

    # ------------------------------------------------------------------ stop requests

    def insert_stop(self, mode: StopMode, requested_by: str | None, now: float) -> int:
        """A new stop request in REQUESTED; returns its id."""
        self._stop = _UNREAD
        inserted = self.conn.execute(
            t.stop_requests.insert().values(
                pipeline_key=self.key,
                mode=mode.value,
                state=StopState.REQUESTED.value,
                requested_by=requested_by,
                requested_at=now,
            )
        ).inserted_primary_key
        assert inserted is not None
        return int(inserted[0])

    def update_stop(
        self,
        request_id: int,
        *,
        state: StopState | None = None,
        savepoint_id: int | None = None,
        finished_at: float | None = None,
        failure_reason: str | None = None,
        requested_by: str | None = None,
    ) -> None:
        """Write the given fields of a stop request (None: left as is)."""
        self._stop = _UNREAD
        values: dict[str, Any] = {}
        if state is not None:
            values["state"] = state.value
        if savepoint_id is not None:
            values["savepoint_id"] = savepoint_id
        if finished_at is not None:
            values["finished_at"] = finished_at
        if failure_reason is not None:
            values["failure_reason"] = failure_reason
        if requested_by is not None:
            values["requested_by"] = requested_by
        self.conn.execute(
            update(t.stop_requests)
            .where(t.stop_requests.c.request_id == request_id)
            .values(**values)
        )


def lock_pipeline(conn: Connection, pipeline_key: str) -> Mapping[str, Any] | None:
    """Lock the pipeline row (FOR UPDATE; SQLite already holds the write lock) and read every
    column but the graph (O(stages) of JSON, read only when its fingerprint changes).
    """
    row = conn.execute(LOCK_PIPELINE, {"b_key": pipeline_key}).mappings().first()
    return None if row is None else dict(row)
