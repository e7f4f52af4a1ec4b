"""Every read of one pipeline's coordination rows, on a connection the caller holds (inside the
locked transition or a plain read): the coordinator's queries, one method each.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import bindparam, func, select

from airflow_finalckpt.core.errors import (
    IllegalTransitionError,
    UnknownPipelineError,
    UnknownStageError,
)
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    SinkTransaction,
    StageLifecycle,
    TransactionState,
)
from airflow_finalckpt.core.views import (
    CheckpointInfo,
    PipelineSnapshot,
    StageRow,
    StopRequest,
    TxnRow,
    WaitingStage,
)
from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.reads_checkpoint import CheckpointReader

#: States of a checkpoint that can still close a finished stage (in flight or done).
CANDIDATE_STATES = (
    CheckpointState.PENDING.value,
    CheckpointState.COMPLETED.value,
    CheckpointState.DISCARDED.value,
)


# Reads every acknowledgement runs, built once and executed with bound values (SQLAlchemy
# caches their compiled form by statement; building one cost more than running it).
_STAGE_ROW = select(t.stages).where(
    t.stages.c.pipeline_key == bindparam("b_key"), t.stages.c.stage_id == bindparam("b_stage")
)
_UNCOMMITTED = (
    select(t.transactions)
    .where(
        t.transactions.c.pipeline_key == bindparam("b_key"),
        t.transactions.c.stage_id == bindparam("b_stage"),
        t.transactions.c.state == TransactionState.PRECOMMITTED.value,
    )
    .order_by(t.transactions.c.sink_id, t.transactions.c.txn_id)
)
_LATEST_STOP = (
    select(t.stop_requests)
    .where(t.stop_requests.c.pipeline_key == bindparam("b_key"))
    .order_by(t.stop_requests.c.request_id.desc())
    .limit(1)
)


class StoreReader(CheckpointReader):
    """Reads of one pipeline's rows over ``conn`` (the acknowledgement reads: ``AckReader``,
    the trigger's and completion's: ``CheckpointReader``).
    """

    # ------------------------------------------------------------------ pipeline

    def graph_data(self) -> dict[str, Any]:
        """The stored graph JSON; UnknownPipelineError if the pipeline is not registered."""
        data = self.conn.execute(
            select(t.pipelines.c.graph).where(t.pipelines.c.pipeline_key == self.key)
        ).scalar()
        if data is None:
            raise UnknownPipelineError(f"pipeline {self.key!r} is not registered")
        return dict(data)

    def checkpoint_timeout(self) -> float:
        """The pipeline's checkpoint timeout; UnknownPipelineError if it is not registered."""
        timeout = self.conn.execute(
            select(t.pipelines.c.checkpoint_timeout_s).where(t.pipelines.c.pipeline_key == self.key)
        ).scalar()
        if timeout is None:
            raise UnknownPipelineError(
                f"pipeline {self.key!r} is not registered in the coordination store"
            )
        return float(timeout)

    def next_checkpoint_id(self) -> int:
        """The id the next checkpoint will get (a finishing stage's threshold)."""
        return int(
            self.conn.execute(
                select(t.pipelines.c.next_checkpoint_id).where(
                    t.pipelines.c.pipeline_key == self.key
                )
            ).scalar_one()
        )

    def restored_from(self) -> str | None:
        """The checkpoint or savepoint the pipeline was last restored from."""
        value = self.conn.execute(
            select(t.pipelines.c.restored_from).where(t.pipelines.c.pipeline_key == self.key)
        ).scalar()
        return None if value is None else str(value)

    # ------------------------------------------------------------------ stages

    def live_stages(self, now: float) -> list[str]:
        """RUNNING stages whose attempt is alive (no lease yet, or a lease not past)."""
        s = t.stages.c
        rows = self.conn.execute(
            select(s.stage_id)
            .where(
                s.pipeline_key == self.key,
                s.lifecycle == StageLifecycle.RUNNING.value,
                s.lease_until.is_(None) | (s.lease_until > now),
            )
            .order_by(s.stage_id)
        ).scalars()
        return [str(sid) for sid in rows]

    def joined_at(self, dag_id: str, run_id: str) -> float | None:
        """When the DAG run joined this pipeline (None: it has not)."""
        value = self.conn.execute(
            select(t.dag_runs.c.created_at).where(
                t.dag_runs.c.dag_id == dag_id,
                t.dag_runs.c.run_id == run_id,
                t.dag_runs.c.pipeline_key == self.key,
            )
        ).scalar()
        return None if value is None else float(value)

    def stage_rows(self) -> dict[str, StageRow]:
        """Every stage of the pipeline, by stage id."""
        return {
            row["stage_id"]: r.stage_row(row)
            for row in self.conn.execute(
                select(t.stages)
                .where(t.stages.c.pipeline_key == self.key)
                .order_by(t.stages.c.stage_id)
            ).mappings()
        }

    def lifecycles(self) -> dict[str, StageLifecycle]:
        """Every stage's lifecycle, by stage id (no progress JSON)."""
        rows = self.conn.execute(
            select(t.stages.c.stage_id, t.stages.c.lifecycle).where(
                t.stages.c.pipeline_key == self.key
            )
        ).all()
        return {str(sid): StageLifecycle(lifecycle) for sid, lifecycle in rows}

    def stage_row(self, stage_id: str) -> StageRow:
        """One stage; UnknownStageError if the pipeline has no such stage."""
        params = {"b_key": self.key, "b_stage": stage_id}
        row = self.conn.execute(_STAGE_ROW, params).mappings().first()
        if row is None:
            raise UnknownStageError(f"stage {stage_id!r} is not part of pipeline {self.key!r}")
        return r.stage_row(row)

    def stage_finish_state(self, stage_id: str) -> tuple[StageLifecycle, int | None]:
        """Lifecycle and finish threshold only (no progress JSON): the waiters' hot read."""
        row = self.conn.execute(
            select(t.stages.c.lifecycle, t.stages.c.finish_threshold).where(
                t.stages.c.pipeline_key == self.key, t.stages.c.stage_id == stage_id
            )
        ).first()
        if row is None:
            raise UnknownStageError(f"stage {stage_id!r} is not part of pipeline {self.key!r}")
        return StageLifecycle(row.lifecycle), row.finish_threshold

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, checkpoint_id: int) -> CheckpointInfo:
        """One checkpoint; UnknownCheckpointError if there is none."""
        return r.checkpoint_info(self._checkpoint(checkpoint_id))

    def checkpoint_state(self, checkpoint_id: int) -> CheckpointState | None:
        """The checkpoint's state, None if it does not exist."""
        state = self.conn.execute(
            select(t.checkpoints.c.state).where(
                t.checkpoints.c.pipeline_key == self.key,
                t.checkpoints.c.checkpoint_id == checkpoint_id,
            )
        ).scalar()
        return None if state is None else CheckpointState(state)

    def checkpoints(self, *, limit: int | None = None) -> list[CheckpointInfo]:
        """Checkpoints, newest first."""
        query = (
            select(t.checkpoints)
            .where(t.checkpoints.c.pipeline_key == self.key)
            .order_by(t.checkpoints.c.checkpoint_id.desc())
        )
        if limit is not None:
            query = query.limit(limit)
        return [r.checkpoint_info(row) for row in self.conn.execute(query).mappings()]

    def latest_completed(self, *, include_discarded: bool) -> CheckpointInfo | None:
        """The newest completed (or, if asked, discarded) checkpoint."""
        states = [CheckpointState.COMPLETED.value]
        if include_discarded:
            states.append(CheckpointState.DISCARDED.value)
        row = (
            self.conn.execute(
                select(t.checkpoints)
                .where(
                    t.checkpoints.c.pipeline_key == self.key,
                    t.checkpoints.c.state.in_(states),
                )
                .order_by(t.checkpoints.c.checkpoint_id.desc())
                .limit(1)
            )
            .mappings()
            .first()
        )
        return None if row is None else r.checkpoint_info(row)

    def latest_completed_id(self) -> int | None:
        """The newest checkpoint that ever completed (discarded since or not)."""
        cid = self.conn.execute(
            select(func.max(t.checkpoints.c.checkpoint_id)).where(
                t.checkpoints.c.pipeline_key == self.key,
                t.checkpoints.c.completed_at.is_not(None),
            )
        ).scalar()
        return None if cid is None else int(cid)

    def _pending_with(self, column: Any) -> Sequence[Any]:
        """(id, ``column``) of every pending checkpoint, oldest first."""
        return self.conn.execute(
            select(t.checkpoints.c.checkpoint_id, column)
            .where(
                t.checkpoints.c.pipeline_key == self.key,
                t.checkpoints.c.state == CheckpointState.PENDING.value,
            )
            .order_by(t.checkpoints.c.checkpoint_id)
        ).all()

    def pending(self) -> list[tuple[int, float]]:
        """(id, triggered_at) of every pending checkpoint, oldest first."""
        rows = self._pending_with(t.checkpoints.c.triggered_at)
        return [(int(cid), float(at)) for cid, at in rows]

    def pending_ids(self) -> list[int]:
        """Ids of the pending checkpoints, oldest first."""
        return [cid for cid, _ in self.pending()]

    def pending_kinds(self) -> list[tuple[int, CheckpointKind]]:
        """(id, kind) of every pending checkpoint, oldest first."""
        rows = self._pending_with(t.checkpoints.c.kind)
        return [(int(cid), CheckpointKind(kind)) for cid, kind in rows]

    def first_completed_from(self, threshold: int | None) -> int | None:
        """The lowest checkpoint >= ``threshold`` that completed (discarded since or not)."""
        cid = self.conn.execute(
            select(func.min(t.checkpoints.c.checkpoint_id)).where(
                t.checkpoints.c.pipeline_key == self.key,
                t.checkpoints.c.completed_at.is_not(None),
                t.checkpoints.c.checkpoint_id >= threshold,
            )
        ).scalar()
        return None if cid is None else int(cid)

    def has_candidate_from(self, threshold: int) -> bool:
        """Is a checkpoint >= ``threshold`` pending, completed or discarded?"""
        found = self.conn.execute(
            select(t.checkpoints.c.checkpoint_id)
            .where(
                t.checkpoints.c.pipeline_key == self.key,
                t.checkpoints.c.checkpoint_id >= threshold,
                t.checkpoints.c.state.in_(CANDIDATE_STATES),
            )
            .limit(1)
        ).first()
        return found is not None

    def completed_checkpoints(self) -> list[tuple[int, str | None]]:
        """(id, metadata path) of the COMPLETED checkpoints (not savepoints), newest first."""
        rows = self.conn.execute(
            select(t.checkpoints.c.checkpoint_id, t.checkpoints.c.metadata_path)
            .where(
                t.checkpoints.c.pipeline_key == self.key,
                t.checkpoints.c.state == CheckpointState.COMPLETED.value,
                t.checkpoints.c.kind == CheckpointKind.CHECKPOINT.value,
            )
            .order_by(t.checkpoints.c.checkpoint_id.desc())
        ).all()
        return [(int(cid), None if path is None else str(path)) for cid, path in rows]

    def final_among(self, checkpoint_ids: Collection[int]) -> list[int]:
        """Which of ``checkpoint_ids`` are ABORTED or DISCARDED (final states), ascending."""
        return sorted(
            int(cid)
            for cid in self.conn.execute(
                select(t.checkpoints.c.checkpoint_id).where(
                    t.checkpoints.c.pipeline_key == self.key,
                    t.checkpoints.c.checkpoint_id.in_(checkpoint_ids),
                    t.checkpoints.c.state.in_(
                        [CheckpointState.ABORTED.value, CheckpointState.DISCARDED.value]
                    ),
                )
            ).scalars()
        )

    # ------------------------------------------------------------------ acknowledgements

    # ------------------------------------------------------------------ transactions

    def uncommitted(self, stage_id: str) -> list[SinkTransaction]:
        """The stage's pre-committed transactions, by sink and transaction id."""
        params = {"b_key": self.key, "b_stage": stage_id}
        return [
            r.sink_transaction(row) for row in self.conn.execute(_UNCOMMITTED, params).mappings()
        ]

    def transaction(self, stage_id: str, sink_id: str, txn_id: str) -> TxnRow:
        """One transaction; IllegalTransitionError if the stage never recorded it."""
        row = (
            self.conn.execute(
                select(t.transactions).where(
                    t.transactions.c.pipeline_key == self.key,
                    t.transactions.c.stage_id == stage_id,
                    t.transactions.c.sink_id == sink_id,
                    t.transactions.c.txn_id == txn_id,
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            raise IllegalTransitionError(
                f"stage {stage_id!r} has no transaction {txn_id!r} for sink {sink_id!r}"
            )
        return TxnRow(r.sink_transaction(row), str(row["state"]))

    def transactions(self, stage_id: str | None) -> list[tuple[SinkTransaction, str]]:
        """Every recorded transaction with its state (of one stage if given)."""
        query = select(t.transactions).where(t.transactions.c.pipeline_key == self.key)
        if stage_id is not None:
            query = query.where(t.transactions.c.stage_id == stage_id)
        return [
            (r.sink_transaction(row), row["state"])
            for row in self.conn.execute(query.order_by(t.transactions.c.txn_id)).mappings()
        ]

    # ------------------------------------------------------------------ stop requests

    def latest_stop(self) -> StopRequest | None:
        """The newest stop request."""
        row = self.conn.execute(_LATEST_STOP, {"b_key": self.key}).mappings().first()
        return None if row is None else r.stop_request(row)

    # ------------------------------------------------------------------ read models

    def waiting_snapshot(self) -> PipelineSnapshot:
        """Everything waiting stages decide on, in five statements whatever the number of
        stages; UnknownPipelineError if the pipeline is not registered.
        """
        s, c = t.stages, t.checkpoints

        def first(*where: Any) -> Any:
            """The lowest checkpoint id >= the stage's finish threshold matching ``where``
            (a correlated subquery: the database answers every stage in one statement).
            """
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

        timeout = self.checkpoint_timeout()
        rows = self.conn.execute(
            select(
                s.c.stage_id,
                s.c.lifecycle,
                s.c.epoch,
                s.c.finish_threshold,
                s.c.closed_checkpoint_id,
                first(c.c.completed_at.is_not(None)).label("first_completed_id"),
                first(c.c.state.in_(CANDIDATE_STATES)).label("first_candidate_id"),
            ).where(s.c.pipeline_key == self.key)
        ).all()
        pending = self.pending()
        stop = self.latest_stop()
        return PipelineSnapshot(
            pipeline_key=self.key,
            checkpoint_timeout_s=timeout,
            stages={
                row.stage_id: WaitingStage(
                    stage_id=row.stage_id,
                    lifecycle=StageLifecycle(row.lifecycle),
                    epoch=int(row.epoch),
                    finish_threshold=row.finish_threshold,
                    closed_checkpoint_id=row.closed_checkpoint_id,
                    first_completed_id=row.first_completed_id,
                    first_candidate_id=row.first_candidate_id,
                )
                for row in rows
            },
            stop=stop,
            pending=tuple(pending),
            awaited_leases=self.awaited_leases(),
        )
