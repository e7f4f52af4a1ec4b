"""Incremental sources: which part of a growing input a pipeline run reads, and how the read
position advances with the run's committed outputs (docs/sources.md).

A *cursor* is the durable read position of one source: the Iceberg snapshot id or Delta
version read completely (``position``), plus the files read beyond it (``consumed``: a landing
directory has no position, so every file it read, identified by path, size and modification
time). A pipeline run's *range* is fixed when its source stage first starts: the files the
source lists beyond the committed cursor, up to the newest snapshot or version at that moment.
The range is recorded with the pipeline, so retries, resumes, savepoints and clears of that run
read exactly it; the cursor advances over it only in the transition that closes the pipeline's
last stage, after every output was committed (``advance``). Plain values and rules: the store
keeps them, the sources list files, nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from airflow_finalckpt.core.errors import SourceRangeBusyError, SourceRefusedError

#: The kinds of source a cursor belongs to; a landing directory has no position.
LANDING, ICEBERG, DELTA = "landing", "iceberg", "delta"
CURSOR_KINDS = (LANDING, ICEBERG, DELTA)


@dataclass(frozen=True)
class SourceFile:
    """One unit of input: ``split_id`` is what the transform reads (``ctx.splits``: the file's
    URL), ``identity`` what a cursor remembers once it is read (a landing file's
    ``path|size|mtime``, so a file rewritten in place is new input; a table file's path).
    """

    split_id: str
    identity: str

    def to_json(self) -> list[str]:
        """Compact: ``[split_id, identity]``."""
        return [self.split_id, self.identity]

    @classmethod
    def from_json(cls, doc: Sequence[str]) -> SourceFile:
        """Back from ``to_json``."""
        return cls(split_id=str(doc[0]), identity=str(doc[1]))


@dataclass(frozen=True)
class Listing:
    """What a source found beyond a cursor when a run starts: the newest snapshot id or
    version (None for a landing directory) and the files added after the cursor's position,
    in the order a run should read them.
    """

    newest: int | None
    files: tuple[SourceFile, ...] = ()


@dataclass(frozen=True)
class Cursor:
    """The committed read position of one source (``cursor_id``); ``version`` counts its
    advances, so an advance planned from another version is refused (compare and set).
    """

    cursor_id: str
    kind: str
    position: int | None = None
    consumed: frozenset[str] = frozenset()
    version: int = 0

    def to_json(self) -> dict[str, Any]:
        """The stored form (consumed identities sorted, so equal cursors store equal JSON)."""
        return {
            "kind": self.kind,
            "position": self.position,
            "consumed": sorted(self.consumed),
            "version": self.version,
        }

    @classmethod
    def from_json(cls, cursor_id: str, doc: Mapping[str, Any]) -> Cursor:
        """Back from ``to_json``."""
        position = doc.get("position")
        return cls(
            cursor_id=cursor_id,
            kind=str(doc["kind"]),
            position=None if position is None else int(position),
            consumed=frozenset(str(i) for i in doc.get("consumed") or ()),
            version=int(doc.get("version") or 0),
        )


@dataclass(frozen=True)
class SourceRange:
    """What one pipeline run reads of a source: the files beyond the cursor at ``start``
    (cursor version ``cursor_version``) up to ``end`` (the newest position when planned).
    """

    cursor_id: str
    kind: str
    start: int | None
    end: int | None
    cursor_version: int
    files: tuple[SourceFile, ...] = ()

    @property
    def splits(self) -> list[str]:
        """The split ids, in reading order: the source stage's splits for this run."""
        return [f.split_id for f in self.files]

    def only(self, read: Collection[str]) -> SourceRange:
        """The same range restricted to the splits in ``read`` (what a drained run read)."""
        return replace(self, files=tuple(f for f in self.files if f.split_id in read))

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {
            "kind": self.kind,
            "start": self.start,
            "end": self.end,
            "cursor_version": self.cursor_version,
            "files": [f.to_json() for f in self.files],
        }

    @classmethod
    def from_json(cls, cursor_id: str, doc: Mapping[str, Any]) -> SourceRange:
        """Back from ``to_json``."""
        start, end = doc.get("start"), doc.get("end")
        return cls(
            cursor_id=cursor_id,
            kind=str(doc["kind"]),
            start=None if start is None else int(start),
            end=None if end is None else int(end),
            cursor_version=int(doc.get("cursor_version") or 0),
            files=tuple(SourceFile.from_json(f) for f in doc.get("files") or ()),
        )


class RangeState(StrEnum):
    """A recorded range: OPEN until its pipeline's outputs committed (the cursor then
    advances and it is COMMITTED); RECOMPUTE: a copy another pipeline of the same interval
    reads again (a rerun), which never advances the cursor.
    """

    OPEN = "OPEN"
    COMMITTED = "COMMITTED"
    RECOMPUTE = "RECOMPUTE"


@dataclass(frozen=True)
class RecordedRange:
    """A range as the store keeps it: whose it is and what became of it. ``read``: the
    splits the cursor advanced over (None until it is COMMITTED).
    """

    pipeline_key: str
    stage_id: str
    state: RangeState
    range: SourceRange
    dag_id: str | None = None
    run_id: str | None = None
    logical_date: str | None = None
    read: frozenset[str] | None = None

    def effective(self) -> SourceRange:
        """What a run reading this record again reads: a committed range only the splits the
        cursor advanced over (a drained run's unread splits belong to the next run).
        """
        return self.range if self.read is None else self.range.only(self.read)


def new_cursor(cursor_id: str, kind: str, position: int | None = None) -> Cursor:
    """A cursor that has read nothing (``position``: start after that snapshot/version)."""
    if kind not in CURSOR_KINDS:
        raise ValueError(f"cursor {cursor_id!r}: kind must be one of {CURSOR_KINDS}, not {kind!r}")
    return Cursor(cursor_id=cursor_id, kind=kind, position=position)


def plan_range(cursor: Cursor, listing: Listing) -> SourceRange:
    """The range of a new run: the listed files the cursor has not consumed, up to the
    newest position (a landing directory: every file not consumed yet). A split id listed
    twice is refused: it would be read twice.
    """
    files: list[SourceFile] = []
    seen: set[str] = set()
    for f in listing.files:
        if f.identity in cursor.consumed:
            continue
        if f.split_id in seen:
            raise SourceRefusedError(
                f"source {cursor.cursor_id!r}: file {f.split_id!r} is listed twice in one range "
                "(rewritten between two snapshots?); it would be read twice"
            )
        seen.add(f.split_id)
        files.append(f)
    end = cursor.position if listing.newest is None else listing.newest
    return SourceRange(
        cursor_id=cursor.cursor_id,
        kind=cursor.kind,
        start=cursor.position,
        end=end,
        cursor_version=cursor.version,
        files=tuple(files),
    )


@dataclass(frozen=True)
class RangeChoice:
    """What a starting source stage reads: ``recorded`` again (its own pipeline's range, or
    the committed range of an earlier run of the same logical date: a rerun recomputes it),
    or a new range planned from the cursor (``recorded`` None).
    """

    recorded: RecordedRange | None
    rerun_of: str | None = None


def choose_range(
    cursor_id: str,
    pipeline_key: str,
    logical_date: str | None,
    recorded: Iterable[RecordedRange],
) -> RangeChoice:
    """The rule of a run's range. In order:

    1. the pipeline recorded a range already: read it again (a retry, a resume, a restore,
       a clear of the source stage: the same range, never the newest data);
    2. another pipeline's range is OPEN (its outputs are not committed): refused with
       ``SourceRangeBusyError`` naming it, since two runs must never read one range (Airflow
       retries the task; ``max_active_runs=1`` serializes the runs instead);
    3. a committed range of an earlier run of the same logical date exists: a rerun of that
       interval recomputes that range (the newest such);
    4. else plan a new range from the committed cursor.
    """
    records = list(recorded)
    for rec in records:
        if rec.pipeline_key == pipeline_key:
            return RangeChoice(recorded=rec)
    busy = [rec for rec in records if rec.state is RangeState.OPEN]
    if busy:
        holder = busy[0]
        run = f"DAG run {holder.run_id!r} of {holder.dag_id!r}" if holder.run_id else "a run"
        raise SourceRangeBusyError(
            f"source {cursor_id!r}: {run} (pipeline {holder.pipeline_key!r}) has read a range of "
            f"{len(holder.range.files)} file(s) whose outputs are not committed yet; this run "
            "reads only after that one committed (rule one-open-range-per-source). Let that "
            "run finish (clear it if it failed), or delete its pipeline (finalckpt pipelines "
            "delete KEY --force) to give its range back; max_active_runs=1 serializes the runs"
        )
    if logical_date is not None:
        same = [
            rec
            for rec in records
            if rec.logical_date == logical_date and rec.state is RangeState.COMMITTED
        ]
        if same:
            return RangeChoice(recorded=same[-1], rerun_of=same[-1].pipeline_key)
    return RangeChoice(recorded=None)


def advance(cursor: Cursor, rng: SourceRange, read: Collection[str]) -> Cursor:
    """The cursor after a run's outputs committed, having read the splits ``read`` of
    ``rng``. A run that read its whole range moves a table cursor to the range's end (what it
    consumed beyond its old position is behind the new one); a drained run that left splits
    unread keeps the position and remembers the files it did read, so the next run reads the
    rest. A landing directory's cursor remembers every file read. Refused if the cursor
    advanced since the range was planned (compare and set on ``version``).
    """
    if cursor.version != rng.cursor_version or cursor.position != rng.start:
        raise SourceRefusedError(
            f"source {cursor.cursor_id!r}: the cursor moved (version {cursor.version}, "
            f"position {cursor.position}) since this run's range was planned from version "
            f"{rng.cursor_version}, position {rng.start}; advancing it again would skip or "
            "repeat input (was the cursor changed by hand?)"
        )
    wanted = set(read)
    done = {f.identity for f in rng.files if f.split_id in wanted}
    complete = len(done) == len(rng.files)
    if cursor.kind != LANDING and complete:
        return replace(cursor, position=rng.end, consumed=frozenset(), version=cursor.version + 1)
    return replace(cursor, consumed=cursor.consumed | done, version=cursor.version + 1)


def default_cursor_id(dag_id: str | None, stage_id: str) -> str:
    """One cursor per DAG and source stage unless the source names its own."""
    return f"{dag_id}.{stage_id}" if dag_id else stage_id
