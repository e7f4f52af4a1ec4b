"""Reads of the checkpoint's trigger and completion, the base of ``StoreReader``: every stage's
lifecycle for the plan (no progress JSON), what a completion records of finished stages (their
end and stored entry, never their split ids), the progress of stages that have not started and
the uncommitted transactions, each in one statement whatever the number of stages.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import JSON, Text, case, cast, exists, func, literal, null, select, type_coerce

from airflow_finalckpt.core.model import (
    EndOfData,
    FinishedStageEnd,
    SinkTransaction,
    StageCheckpointRecord,
    StageLifecycle,
    StageSnapshot,
    TransactionState,
)
from airflow_finalckpt.core.views import parse_snapshot
from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.reads_acks import AckReader


@dataclass
class FinishedStages:
    """What a completion records of the finished stages (``CheckpointReader.finished_stages``):
    built from their stored entry (``records``, without transactions, and those ``entries``),
    or their ``ends``.
    """

    records: dict[str, StageCheckpointRecord] = field(default_factory=dict)
    entries: dict[str, str] = field(default_factory=dict)
    ends: dict[str, FinishedStageEnd] = field(default_factory=dict)


#: Lifecycles of a stage that is (or was, suspended) running: it has progress but no final.
RUNNING_STATES = (StageLifecycle.RUNNING.value, StageLifecycle.SUSPENDED.value)
_LIFECYCLES = {lifecycle.value: lifecycle for lifecycle in StageLifecycle}


class CheckpointReader(AckReader):
    """The trigger's and the completion's reads of one pipeline's rows over ``conn``."""

    # ------------------------------------------------------------------ trigger

    def plan_lifecycles(self) -> tuple[dict[str, StageLifecycle], set[str]]:
        """What the plan of a trigger needs (``plan.plan_of_lifecycles``): every stage's
        lifecycle, and which of the stages that have not finished hold finished splits
        (counted by the database in their progress JSON, which is never sent: a finished
        stage is a flag, a running one's split ids are not part of the plan).
        """
        s = t.stages.c
        unfinished = [StageLifecycle.NOT_STARTED.value, *RUNNING_STATES]
        count = _finished_split_count(self.conn.dialect.name, s.progress)
        rows = self.conn.execute(
            select(
                s.stage_id, s.lifecycle, case((s.lifecycle.in_(unfinished), count), else_=null())
            ).where(s.pipeline_key == self.key)
        ).all()
        lifecycles = {str(sid): _LIFECYCLES[lifecycle] for sid, lifecycle, _ in rows}
        return lifecycles, {str(sid) for sid, _, count in rows if count}

    # ------------------------------------------------------------------ completion (metadata v2)

    def finished_stages(self) -> FinishedStages:
        """Of every FINISHED or CLOSED stage, what a checkpoint records of it, its finished
        split ids never read. A stage with a stored entry (``final_entry``, encoded when it
        finished: ``codec.finished_entry_text``) is built from that entry alone, in one step,
        and keeps it, so record and entry say the same. Else its end is read from its narrow
        ``final_end`` column (end_of_data, watermark, finished split count, written with the
        final snapshot), or, finished by a version without that column, through JSON paths of
        its final snapshot.
        """
        s = t.stages.c
        no_entry = s.final_entry.is_(None)
        end_column = type_coerce(case((no_entry, s.final_end), else_=null()), JSON)
        rows = self.conn.execute(
            select(
                s.stage_id,
                s.total_splits,
                s.final_entry,
                end_column,
                *_legacy_end_columns(self.conn),
            ).where(s.pipeline_key == self.key, s.lifecycle.in_(FINISHED_STATES))
        ).all()
        found = FinishedStages()
        for sid, total, entry, end, done, eod, wm in rows:
            if entry is not None:
                found.records[str(sid)] = _record_of_entry(str(sid), entry)
                found.entries[str(sid)] = entry
                continue
            if end is not None:
                done, eod, wm = end["finished"], end["end_of_data"], end["watermark"]
            found.ends[str(sid)] = finished_end(total, done, eod, wm)
        return found

    def unstarted_progress(self) -> dict[str, StageSnapshot]:
        """The progress of every stage that has not started work: NOT_STARTED (possibly with
        restored progress) or SUSPENDED at its start; by stage id.
        """
        s = t.stages.c
        idle = (StageLifecycle.NOT_STARTED.value, StageLifecycle.SUSPENDED.value)
        # The database compares the stored text with the empty progress as it is written and
        # sends NULL for those (most stages that have not started): nothing to decode. Text
        # written otherwise (another key order) is decoded and compared as before.
        empty = cast(s.progress, Text) == literal(_EMPTY_PROGRESS_TEXT, Text)
        progress = type_coerce(case((empty, null()), else_=s.progress), JSON)
        rows = self.conn.execute(
            select(s.stage_id, progress).where(s.pipeline_key == self.key, s.lifecycle.in_(idle))
        ).all()
        return {str(sid): EMPTY_PROGRESS if data is None else _progress(data) for sid, data in rows}

    def uncommitted_of(
        self, stage_ids: Collection[str], *, unacked: int | None = None
    ) -> dict[str, list[SinkTransaction]]:
        """The pre-committed transactions of ``stage_ids`` (each by sink and transaction id),
        in one query. ``unacked``: a checkpoint none of ``stage_ids`` acknowledged, whose
        acknowledging stages' transactions the database leaves out (a completion records
        those from the acknowledgements: every running stage holds some).
        """
        wanted = set(stage_ids)
        found: dict[str, list[SinkTransaction]] = {sid: [] for sid in wanted}
        if not wanted:
            return found
        x = t.transactions.c
        query = select(t.transactions).where(
            x.pipeline_key == self.key, x.state == TransactionState.PRECOMMITTED.value
        )
        if unacked is not None:
            a = t.acks.c
            acked = exists().where(
                a.pipeline_key == x.pipeline_key,
                a.checkpoint_id == unacked,
                a.stage_id == x.stage_id,
            )
            query = query.where(~acked)
        rows = self.conn.execute(query.order_by(x.stage_id, x.sink_id, x.txn_id)).mappings()
        for row in rows:
            if row["stage_id"] in wanted:
                found[row["stage_id"]].append(r.sink_transaction(row))
        return found


#: A stage's progress before it did anything, shared (snapshots are frozen): most stages that
#: have not started hold exactly this, and validating thousands of them cost a completion more
#: than reading them.
EMPTY_PROGRESS = StageSnapshot()
_EMPTY_PROGRESS_DATA = r.dump(EMPTY_PROGRESS)
#: How SQLAlchemy's JSON type writes it (``json.dumps``; the column keeps that text).
_EMPTY_PROGRESS_TEXT = json.dumps(_EMPTY_PROGRESS_DATA)


def _progress(data: Any) -> StageSnapshot:
    """A stored progress, the shared empty one without validating it."""
    return EMPTY_PROGRESS if data == _EMPTY_PROGRESS_DATA else parse_snapshot(data)


#: Lifecycles of a stage whose finish() ran.
FINISHED_STATES = (StageLifecycle.FINISHED.value, StageLifecycle.CLOSED.value)


def _record_of_entry(stage_id: str, entry: str) -> StageCheckpointRecord:
    """The FULLY_FINISHED stage a ``final_entry`` encodes (its transactions empty), parsed
    and validated in one step (thousands a completion): the entry's keys are the record's
    fields but its id and status.
    """
    if not entry.startswith('{"end_of_data":'):
        raise ValueError(f"a stored final_entry is not a finished stage's entry: {entry[:80]!r}")
    head = (
        f'{{"stage_id":{json.encoder.encode_basestring_ascii(stage_id)},"status":"FULLY_FINISHED",'
    )
    return StageCheckpointRecord.model_validate_json(head + entry[1:])


def _finished_split_count(dialect: str, snapshot: Any) -> Any:
    """The length of a stored snapshot's ``finished_splits`` list, counted by the database."""
    if dialect == "postgresql":
        return func.json_array_length(snapshot["finished_splits"])
    return func.json_array_length(snapshot, "$.finished_splits")


def _legacy_end_columns(conn: Any) -> tuple[Any, Any, Any]:
    """Finished split count, end_of_data and watermark through JSON paths of the final
    snapshot, evaluated only for a row without ``final_end`` (CASE: NULL for the others).
    """
    s = t.stages.c
    final = s.final_snapshot
    count = _finished_split_count(conn.dialect.name, final)
    legacy = s.final_end.is_(None)
    return (
        case((legacy, count), else_=null()),
        type_coerce(case((legacy, final["end_of_data"]), else_=null()), JSON),
        type_coerce(case((legacy, final["watermark"]), else_=null()), JSON),
    )


def finished_end(
    total_splits: int | None, finished: int | None, eod: Any, watermark: Any
) -> FinishedStageEnd:
    """A finished stage's end as the JSON paths of its final snapshot read it; its finished
    split count is the length of the final snapshot's split list, counted by the database, or,
    when that list is empty (a stage restored from metadata v2), the declared splits minus
    those a drain left unread (None: the stage declared none).
    """
    end = None if eod is None else EndOfData.model_validate(eod)
    if not finished:  # no ids: restored from metadata v2 (which keeps none), or none finished
        unread = end.unread_splits if end is not None else 0
        finished = None if total_splits is None else max(0, total_splits - unread)
    return FinishedStageEnd(end_of_data=end, watermark=watermark, finished_count=finished)
