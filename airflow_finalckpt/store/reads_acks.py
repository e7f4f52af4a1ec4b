"""Reads about acknowledgements, the base of ``StoreReader``: which pending checkpoints wait for
a stage (``finalckpt_acks_due``, by its stage index), the ack gate in one statement, what a
finish decides on, and the acknowledgements kept. Each reads O(1) rows per checkpoint, never a
plan's JSON.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, RowMapping, bindparam, func, select

from airflow_finalckpt.core.errors import UnknownCheckpointError
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    StageLifecycle,
    TriggerReason,
)
from airflow_finalckpt.core.transitions_eager import PendingCheckpoint
from airflow_finalckpt.core.views import AckRow, AckTarget, parse_snapshot
from airflow_finalckpt.store import schema as t


def awaiting_select(*columns: Any) -> Any:
    """``columns`` of the pending checkpoints that wait for stage ``b_stage`` of pipeline
    ``b_key`` (its rows in ``finalckpt_acks_due``, by the stage index, joined to the checkpoint).
    """
    due, cks = t.acks_due.c, t.checkpoints.c
    return (
        select(*columns)
        .select_from(
            t.acks_due.join(
                t.checkpoints,
                (cks.pipeline_key == due.pipeline_key) & (cks.checkpoint_id == due.checkpoint_id),
            )
        )
        .where(
            due.pipeline_key == bindparam("b_key"),
            due.stage_id == bindparam("b_stage"),
            cks.state == CheckpointState.PENDING.value,
        )
    )


def newest_acked() -> Any:
    """The newest checkpoint id stage ``b_stage`` of pipeline ``b_key`` acknowledged."""
    acks = t.acks.c
    return (
        select(func.max(acks.checkpoint_id))
        .where(acks.pipeline_key == bindparam("b_key"), acks.stage_id == bindparam("b_stage"))
        .scalar_subquery()
    )


def _awaiting_statement() -> Any:
    """The checkpoints that wait for a stage with what their acknowledgement decides on: built
    once, executed with bound values (its compiled form is cached; building a statement costs
    more than running it).
    """
    due, cks = t.acks_due.c, t.checkpoints.c
    columns = (due.checkpoint_id, cks.acks_pending, cks.triggered_at)
    return awaiting_select(*columns, newest_acked().label("newest")).order_by(due.checkpoint_id)


_AWAITING = _awaiting_statement()


class AckReader:
    """Acknowledgement reads of one pipeline's rows over ``conn``."""

    def __init__(self, conn: Connection, pipeline_key: str) -> None:
        self.conn = conn
        self.key = pipeline_key

    def _checkpoint(self, checkpoint_id: int, *columns: Any) -> RowMapping:
        row = (
            self.conn.execute(
                select(*(columns or (t.checkpoints,))).where(
                    t.checkpoints.c.pipeline_key == self.key,
                    t.checkpoints.c.checkpoint_id == checkpoint_id,
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            raise UnknownCheckpointError(f"pipeline {self.key!r} has no checkpoint {checkpoint_id}")
        return row

    def ack_target(self, checkpoint_id: int, stage_id: str) -> AckTarget:
        """What an acknowledgement of ``checkpoint_id`` by ``stage_id`` decides on, in one
        statement over O(1) rows (the checkpoint's counters, the stage's rows in
        ``finalckpt_acks_due`` and, by the stage index, ``finalckpt_acks``), never the plan's
        JSON.
        """
        c, due, acks = t.checkpoints.c, t.acks_due.c, t.acks.c

        def exists(table: Any, cols: Any) -> Any:
            return (
                select(cols.stage_id)
                .where(
                    cols.pipeline_key == c.pipeline_key,
                    cols.checkpoint_id == c.checkpoint_id,
                    cols.stage_id == stage_id,
                )
                .correlate(t.checkpoints)
                .exists()
            )

        newest = (
            select(func.max(acks.checkpoint_id))
            .where(acks.pipeline_key == c.pipeline_key, acks.stage_id == stage_id)
            .correlate(t.checkpoints)
            .scalar_subquery()
        )
        row = self._checkpoint(
            checkpoint_id,
            c.state,
            c.acks_pending,
            c.triggered_at,
            exists(t.acks_due, due).label("due"),
            exists(t.acks, acks).label("acked"),
            newest.label("newest_acked"),
        )
        newest_acked = row["newest_acked"]
        return AckTarget(
            state=CheckpointState(row["state"]),
            acks_pending=int(row["acks_pending"]),
            triggered_at=float(row["triggered_at"]),
            due=bool(row["due"]),
            acked=bool(row["acked"]),
            newest_acked=None if newest_acked is None else int(newest_acked),
        )

    def awaiting(self, stage_id: str) -> list[int]:
        """Pending checkpoints that wait for ``stage_id``'s acknowledgement, oldest first
        (its rows in ``finalckpt_acks_due``, by the stage index).
        """
        return [cid for cid, _ in self.awaiting_targets(stage_id)]

    def awaiting_targets(self, stage_id: str) -> list[tuple[int, AckTarget]]:
        """``awaiting`` with each checkpoint's ``ack_target``, in one statement: what a batch
        boundary answers (a checkpoint in ``finalckpt_acks_due`` is pending, waits for the
        stage and was not acknowledged by it).
        """
        rows = self.conn.execute(_AWAITING, {"b_key": self.key, "b_stage": stage_id}).all()
        return [
            (
                int(cid),
                AckTarget(
                    state=CheckpointState.PENDING,
                    acks_pending=int(pending),
                    triggered_at=float(triggered_at),
                    due=True,
                    acked=False,
                    newest_acked=None if newest is None else int(newest),
                ),
            )
            for cid, pending, triggered_at, newest in rows
        ]

    def pending_for_finish(self, stage_id: str) -> list[PendingCheckpoint]:
        """Every pending checkpoint as a finish of ``stage_id`` decides on it (whether it waits
        for the stage, whether the stage acknowledged it), oldest first: O(pending) rows.
        """
        cks, due, acks = t.checkpoints, t.acks_due, t.acks
        waits = (
            select(due.c.stage_id)
            .where(
                due.c.pipeline_key == cks.c.pipeline_key,
                due.c.checkpoint_id == cks.c.checkpoint_id,
                due.c.stage_id == stage_id,
            )
            .correlate(cks)
            .exists()
        )
        answered = (
            select(acks.c.stage_id)
            .where(
                acks.c.pipeline_key == cks.c.pipeline_key,
                acks.c.checkpoint_id == cks.c.checkpoint_id,
                acks.c.stage_id == stage_id,
            )
            .correlate(cks)
            .exists()
        )
        rows = self.conn.execute(
            select(
                cks.c.checkpoint_id,
                cks.c.kind,
                cks.c.reason,
                waits.label("waits"),
                answered.label("answered"),
                # the plan's status of the stage, through a JSON path (NULL: not in the plan)
                cks.c.plan["statuses"][stage_id].as_string().label("planned"),
            )
            .where(
                cks.c.pipeline_key == self.key,
                cks.c.state == CheckpointState.PENDING.value,
            )
            .order_by(cks.c.checkpoint_id)
        ).all()
        return [
            PendingCheckpoint(
                checkpoint_id=int(row.checkpoint_id),
                kind=CheckpointKind(row.kind),
                reason=TriggerReason(row.reason),
                waits_for_stage=bool(row.waits),
                acked_by_stage=bool(row.answered),
                plans_stage=row.planned is not None,
            )
            for row in rows
        ]

    def acks(self, checkpoint_id: int) -> dict[str, AckRow]:
        """The acknowledgements of a checkpoint, by stage id."""
        return {
            row["stage_id"]: AckRow(
                row["stage_id"], bool(row["by_finish"]), parse_snapshot(row["snapshot"])
            )
            for row in self.conn.execute(
                select(t.acks).where(
                    t.acks.c.pipeline_key == self.key, t.acks.c.checkpoint_id == checkpoint_id
                )
            ).mappings()
        }

    def pending_ack_snapshots(self) -> list[tuple[int, AckRow]]:
        """(checkpoint id, acknowledgement) of every acknowledgement of a pending checkpoint:
        what garbage collection must keep (they will be recorded as is).
        """
        acks, cks = t.acks, t.checkpoints
        query = (
            select(acks.c.checkpoint_id, acks.c.stage_id, acks.c.by_finish, acks.c.snapshot)
            .join(
                cks,
                (cks.c.pipeline_key == acks.c.pipeline_key)
                & (cks.c.checkpoint_id == acks.c.checkpoint_id),
            )
            .where(
                acks.c.pipeline_key == self.key,
                cks.c.state == CheckpointState.PENDING.value,
            )
        )
        return [
            (int(cid), AckRow(str(sid), bool(by_finish), parse_snapshot(snapshot)))
            for cid, sid, by_finish, snapshot in self.conn.execute(query).all()
        ]

    def awaited_leases(self) -> dict[str, tuple[StageLifecycle, int, float]]:
        """Stage id -> (lifecycle, epoch, lease) of every stage holding a lease that a pending
        checkpoint waits for: what ``core.plan.attempts_gone`` decides on (one statement; a
        stage without a lease or not awaited is never answered for).
        """
        s, due = t.stages.c, t.acks_due.c
        awaited = (
            select(due.stage_id)
            .where(due.pipeline_key == s.pipeline_key, due.stage_id == s.stage_id)
            .exists()
        )
        rows = self.conn.execute(
            select(s.stage_id, s.lifecycle, s.epoch, s.lease_until).where(
                s.pipeline_key == self.key, s.lease_until.is_not(None), awaited
            )
        ).all()
        return {
            str(sid): (StageLifecycle(lifecycle), int(epoch), float(lease))
            for sid, lifecycle, epoch, lease in rows
        }
