"""Row <-> value mapping of the coordination store: the only place that knows how the core's
values are laid out in columns (enums as strings, snapshots and plans as JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from sqlalchemy import Connection, Insert, RowMapping, Table
from sqlalchemy.dialects import postgresql, sqlite

from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.metadata.codec import finished_entry_text
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    FinishedStageEnd,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    StopMode,
    StopState,
    TriggerReason,
)
from airflow_finalckpt.core.plan import CheckpointPlan
from airflow_finalckpt.core.views import (
    KEEP,
    CheckpointInfo,
    StageChange,
    StageRow,
    StopRequest,
)


def dump(snapshot: StageSnapshot) -> dict[str, Any]:
    """A snapshot as stored JSON."""
    return snapshot.model_dump(mode="json")


def insert_ignore(conn: Connection, table: Table, values: Mapping[str, Any]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING on either dialect."""
    conn.execute(insert_ignore_statement(conn, table), dict(values))


@cache
def _insert_ignore(dialect_name: str, table: Table) -> Insert:
    if dialect_name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


def insert_ignore_statement(conn: Connection, table: Table) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING into ``table`` for ``conn``'s dialect, built once per
    dialect and table (executed with the row(s) as parameters).
    """
    return _insert_ignore(conn.dialect.name, table)


def stage_row(row: Mapping[Any, Any]) -> StageRow:
    """A ``finalckpt_stages`` row (JSON left unparsed until used)."""
    return StageRow(
        stage_id=row["stage_id"],
        lifecycle=StageLifecycle(row["lifecycle"]),
        epoch=int(row["epoch"]),
        total_splits=row["total_splits"],
        finish_threshold=row["finish_threshold"],
        closed_checkpoint_id=row["closed_checkpoint_id"],
        updated_at=float(row["updated_at"]),
        progress_data=row["progress"],
        final_data=row["final_snapshot"],
        lease_until=row.get("lease_until"),
    )


def final_end(final: StageSnapshot) -> dict[str, Any]:
    """The ``final_end`` column of a finished stage: what a checkpoint records of it (see
    ``CheckpointReader.finished_stages``), never its split ids.
    """
    eod = final.end_of_data
    return {
        "end_of_data": None if eod is None else eod.model_dump(mode="json"),
        "watermark": final.watermark,
        "finished": len(final.finished_splits),
    }


def final_entry(final: StageSnapshot) -> str | None:
    """The ``final_entry`` column of a finished stage: its entry in a metadata v2
    ``fully_finished`` block without transactions (``codec.finished_entry_text``), exactly as
    a completion would encode it from ``final_end``. None when the final snapshot holds no
    split ids (a stage restored from metadata v2: the completion counts its splits from the
    declared total) or the entry does not match the schema (the completion reports it).
    """
    if not final.finished_splits:
        return None
    end = FinishedStageEnd(
        end_of_data=final.end_of_data,
        watermark=final.watermark,
        finished_count=len(final.finished_splits),
    )
    return finished_entry_text(end)


def stage_values(change: StageChange, now: float) -> dict[str, Any]:
    """The columns a stage change writes (``updated_at`` always)."""
    values: dict[str, Any] = {}
    if change.lifecycle is not None:
        values["lifecycle"] = change.lifecycle.value
    if change.epoch is not None:
        values["epoch"] = change.epoch
        values["lease_until"] = None  # a new attempt holds no lease until it renews one
    if change.total_splits is not None:
        values["total_splits"] = change.total_splits
    if change.progress is not None:
        values["progress"] = dump(change.progress)
    if change.finish_threshold is not KEEP:
        values["finish_threshold"] = change.finish_threshold
    if change.final_snapshot is not KEEP:
        final = change.final_snapshot
        values["final_snapshot"] = None if final is None else dump(final)
        values["final_end"] = None if final is None else final_end(final)
        values["final_entry"] = None if final is None else final_entry(final)
    if change.closed_checkpoint_id is not KEEP:
        values["closed_checkpoint_id"] = change.closed_checkpoint_id
    values["updated_at"] = now
    return values


def checkpoint_info(row: RowMapping) -> CheckpointInfo:
    """A ``finalckpt_checkpoints`` row."""
    kind = row["failure_kind"]
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
        failure_kind=None if kind is None else CheckpointFailureReason(kind),
    )


def sink_transaction(row: RowMapping) -> SinkTransaction:
    """A ``finalckpt_transactions`` row."""
    return SinkTransaction(
        sink_id=row["sink_id"],
        txn_id=row["txn_id"],
        checkpoint_id=row["checkpoint_id"],
        payload=row["payload"] or {},
    )


def stop_request(row: Mapping[Any, Any]) -> StopRequest:
    """A ``finalckpt_stop_requests`` row."""
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
