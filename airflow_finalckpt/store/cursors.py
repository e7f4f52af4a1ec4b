"""The incremental sources' cursors and the ranges pipeline runs read (``finalckpt_source_cursors``,
``finalckpt_source_ranges``; rules in ``core.source_cursor``).

A range is claimed when a source stage first starts (``claim_range``): the source is listed
outside any transaction (a big directory takes seconds, and SQLite has one writer), then one
transaction locks the cursor, decides again on what it reads then, and records the range only
if the cursor did not move meanwhile. The cursor advances in the transition that closes the
pipeline's last stage (``settle_ranges``, called by ``Coordinator.close``), after every output
of the run was committed, in the same database transaction as that close: there is no moment
at which the outputs are visible and the cursor is not advanced, or the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from airflow_finalckpt.core.errors import SourceRangeBusyError, SourceRefusedError
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.core.source_cursor import (
    Cursor,
    Listing,
    RangeState,
    RecordedRange,
    SourceRange,
    advance,
    choose_range,
    new_cursor,
    plan_range,
)
from airflow_finalckpt.core.views import StageRow
from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store import schema as t

#: How often a claim re-lists when the cursor moved between its listing and its write.
CLAIM_ATTEMPTS = 5


def _lock_cursor(conn: Connection, cursor_id: str, kind: str, now: float) -> Cursor:
    """The cursor row, created if missing, locked for this transaction (FOR UPDATE; SQLite's
    engine already holds the write lock). A cursor of another kind is refused.
    """
    fresh = new_cursor(cursor_id, kind)
    r.insert_ignore(
        conn,
        t.source_cursors,
        {
            "cursor_id": cursor_id,
            "kind": kind,
            "position": None,
            "consumed": [],
            "version": 0,
            "updated_at": now,
        },
    )
    query = select(t.source_cursors).where(t.source_cursors.c.cursor_id == cursor_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return _of_kind(_cursor(conn.execute(query).mappings().one()), fresh.kind)


def _of_kind(cursor: Cursor, kind: str) -> Cursor:
    """The cursor, if it belongs to a source of ``kind`` (else refused)."""
    if cursor.kind != kind:
        raise SourceRefusedError(
            f"source cursor {cursor.cursor_id!r} belongs to a {cursor.kind} source, not to a "
            f"{kind} one; give the source its own cursor_id"
        )
    return cursor


def _cursor(row: Mapping[Any, Any]) -> Cursor:
    return Cursor.from_json(
        str(row["cursor_id"]),
        {
            "kind": row["kind"],
            "position": row["position"],
            "consumed": row["consumed"],
            "version": row["version"],
        },
    )


def read_cursor(engine: Engine, cursor_id: str) -> Cursor | None:
    """The committed cursor (None: no run read through it yet)."""
    with engine.connect() as conn:
        row = (
            conn.execute(select(t.source_cursors).where(t.source_cursors.c.cursor_id == cursor_id))
            .mappings()
            .first()
        )
    return None if row is None else _cursor(row)


def _recorded(row: Mapping[Any, Any]) -> RecordedRange:
    read = row["read"]
    return RecordedRange(
        pipeline_key=str(row["pipeline_key"]),
        stage_id=str(row["stage_id"]),
        state=RangeState(row["state"]),
        range=SourceRange.from_json(str(row["cursor_id"]), row["range"]),
        dag_id=row["dag_id"],
        run_id=row["run_id"],
        logical_date=row["logical_date"],
        read=None if read is None else frozenset(str(s) for s in read),
    )


def recorded_ranges(conn: Connection, cursor_id: str) -> list[RecordedRange]:
    """Every range recorded on a cursor, oldest first."""
    rows = conn.execute(
        select(t.source_ranges)
        .where(t.source_ranges.c.cursor_id == cursor_id)
        .order_by(t.source_ranges.c.created_at, t.source_ranges.c.pipeline_key)
    ).mappings()
    return [_recorded(row) for row in rows]


def ranges_of_pipeline(engine: Engine, pipeline_key: str) -> list[RecordedRange]:
    """The ranges one pipeline recorded (one per source it reads)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.source_ranges).where(t.source_ranges.c.pipeline_key == pipeline_key)
        ).mappings()
        return [_recorded(row) for row in rows]


def claim_range(
    engine: Engine,
    *,
    cursor_id: str,
    kind: str,
    pipeline_key: str,
    stage_id: str,
    lister: Callable[[Cursor], Listing],
    now: Callable[[], float],
    dag_id: str | None = None,
    run_id: str | None = None,
    logical_date: str | None = None,
) -> RecordedRange:
    """The range this pipeline reads of the source: the one it recorded before, else the
    committed range of an earlier run of the same logical date (a rerun), else a new range
    listed beyond the committed cursor and recorded OPEN (``core.source_cursor.choose_range``).
    Raises ``SourceRangeBusyError`` while another pipeline's range is OPEN.
    """
    for _ in range(CLAIM_ATTEMPTS):
        with engine.connect() as conn:
            records = recorded_ranges(conn, cursor_id)
            row = (
                conn.execute(
                    select(t.source_cursors).where(t.source_cursors.c.cursor_id == cursor_id)
                )
                .mappings()
                .first()
            )
        cursor = new_cursor(cursor_id, kind) if row is None else _of_kind(_cursor(row), kind)
        choice = choose_range(cursor_id, pipeline_key, logical_date, records)
        if choice.recorded is not None and choice.recorded.pipeline_key == pipeline_key:
            return choice.recorded
        listing = lister(cursor) if choice.recorded is None else None
        with engine.begin() as conn:
            locked = _lock_cursor(conn, cursor_id, kind, now())
            again = choose_range(
                cursor_id, pipeline_key, logical_date, recorded_ranges(conn, cursor_id)
            )
            if locked.version != cursor.version or again != choice:
                continue  # the cursor moved or a range was recorded meanwhile: decide again
            if choice.recorded is None:
                assert listing is not None
                rng, state = plan_range(locked, listing), RangeState.OPEN
            else:
                rng, state = choice.recorded.effective(), RangeState.RECOMPUTE
            record = RecordedRange(
                pipeline_key=pipeline_key,
                stage_id=stage_id,
                state=state,
                range=rng,
                dag_id=dag_id,
                run_id=run_id,
                logical_date=logical_date,
            )
            conn.execute(
                t.source_ranges.insert().values(
                    cursor_id=cursor_id,
                    pipeline_key=pipeline_key,
                    stage_id=stage_id,
                    state=state.value,
                    range=rng.to_json(),
                    read=None,
                    dag_id=dag_id,
                    run_id=run_id,
                    logical_date=logical_date,
                    created_at=now(),
                    settled_at=None,
                )
            )
            return record
    raise SourceRangeBusyError(
        f"source {cursor_id!r}: the cursor kept moving while this run listed its range "
        f"({CLAIM_ATTEMPTS} attempts); the task's retry lists again"
    )


def settle_ranges(
    conn: Connection,
    pipeline_key: str,
    lifecycles: Mapping[str, StageLifecycle],
    stage_row: Callable[[str], StageRow],
    now: float,
) -> list[Cursor]:
    """Within the transition that closed a stage: if every stage of the pipeline is CLOSED
    (every output committed), advance each cursor over the pipeline's OPEN range, by the
    splits its source stage finished, and mark the range COMMITTED. Returns the advanced
    cursors (none for a pipeline still running or without incremental sources).
    """
    if not lifecycles or any(lc is not StageLifecycle.CLOSED for lc in lifecycles.values()):
        return []
    rows = conn.execute(
        select(t.source_ranges).where(
            t.source_ranges.c.pipeline_key == pipeline_key,
            t.source_ranges.c.state == RangeState.OPEN.value,
        )
    ).mappings()
    advanced: list[Cursor] = []
    for record in [_recorded(row) for row in rows]:
        read = _read_splits(
            record, stage_row(record.stage_id) if record.stage_id in lifecycles else None
        )
        cursor = _lock_cursor(conn, record.range.cursor_id, record.range.kind, now)
        moved = advance(cursor, record.range, read)
        done = conn.execute(
            update(t.source_cursors)
            .where(
                t.source_cursors.c.cursor_id == cursor.cursor_id,
                t.source_cursors.c.version == cursor.version,
            )
            .values(
                position=moved.position,
                consumed=sorted(moved.consumed),
                version=moved.version,
                advanced_by=pipeline_key,
                updated_at=now,
            )
        )
        if int(done.rowcount or 0) != 1:  # the lock makes this impossible; never advance twice
            raise SourceRefusedError(f"source cursor {cursor.cursor_id!r} changed while locked")
        complete = len(read) == len(record.range.files)
        conn.execute(
            update(t.source_ranges)
            .where(
                t.source_ranges.c.cursor_id == record.range.cursor_id,
                t.source_ranges.c.pipeline_key == pipeline_key,
            )
            .values(
                state=RangeState.COMMITTED.value,
                read=None if complete else sorted(read),
                settled_at=now,
            )
        )
        advanced.append(moved)
    return advanced


def _read_splits(record: RecordedRange, row: StageRow | None) -> Sequence[str]:
    """The range's splits its source stage finished (all of them unless a drain cut it)."""
    splits = record.range.splits
    if row is None:  # the source stage left the graph: it closed with the range read
        return splits
    snapshot = row.final_snapshot or row.progress
    finished = snapshot.finished_splits
    return [s for s in splits if s in finished]


def release_ranges(conn: Connection, pipeline_key: str) -> int:
    """Forget the ranges a deleted pipeline had not committed (its range is given back to
    the next run); committed ranges stay (a rerun of their logical date reads them again).
    """
    result = conn.execute(
        t.source_ranges.delete().where(
            t.source_ranges.c.pipeline_key == pipeline_key,
            t.source_ranges.c.state != RangeState.COMMITTED.value,
        )
    )
    return int(result.rowcount or 0)


def describe_cursors(
    engine: Engine, cursor_id: str | None = None, *, history: bool = False
) -> list[dict[str, Any]]:
    """Every cursor (or the one named), as ``finalckpt sources list|show`` print it: its
    position, how many files it read beyond it, its advances, the ranges open on it and, with
    ``history``, every range recorded on it (oldest first, with their split ids). Read-only.
    """
    query = select(t.source_cursors).order_by(t.source_cursors.c.cursor_id)
    if cursor_id is not None:
        query = query.where(t.source_cursors.c.cursor_id == cursor_id)
    docs: list[dict[str, Any]] = []
    with engine.connect() as conn:
        for row in conn.execute(query).mappings().all():
            cursor = _cursor(row)
            recorded = recorded_ranges(conn, cursor.cursor_id)
            doc: dict[str, Any] = {
                "cursor_id": cursor.cursor_id,
                "kind": cursor.kind,
                "position": cursor.position,
                "consumed_files": len(cursor.consumed),
                "version": cursor.version,
                "advanced_by": row["advanced_by"],
                "updated_at": row["updated_at"],
                "ranges": len(recorded),
                "open_ranges": [
                    _range_doc(r, splits=False) for r in recorded if r.state is RangeState.OPEN
                ],
            }
            if history:
                doc["history"] = [_range_doc(r, splits=True) for r in recorded]
            docs.append(doc)
    return docs


def _range_doc(record: RecordedRange, *, splits: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "pipeline_key": record.pipeline_key,
        "stage_id": record.stage_id,
        "state": record.state.value,
        "dag_id": record.dag_id,
        "run_id": record.run_id,
        "logical_date": record.logical_date,
        "start": record.range.start,
        "end": record.range.end,
        "cursor_version": record.range.cursor_version,
        "files": len(record.range.files),
        "read": None if record.read is None else len(record.read),
    }
    if splits:
        doc["splits"] = record.range.splits
    return doc
