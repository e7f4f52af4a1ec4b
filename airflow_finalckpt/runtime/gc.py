"""Garbage collection of intermediate outputs and superseded state.

A pipeline directory holds, besides the ``chk-<id>/`` checkpoint directories (owned by
checkpoint retention; only stray temporary files are removed from them here, so a savepoint's own
copies of the files it references, ``chk-<id>/files/``, are never collected)::

    data/<stage>/<batch key>/            an output part (Parquet, read by downstream stages)
    data/<stage>/_parts/<batch key>.json the output handle listing it (``output:<part>,...``)
    state/<stage>/<name>/<uuid>/         a state frame (keyed or stage-global state)
    state/<stage>/<name>/<uuid>.json     its handle (``state:<name>`` / ``global:<name>``)

Every batch writes new files; the coordinator and the checkpoints reference some of them.
``collect_garbage`` deletes the *units* (the entries one level below ``data/<stage>/``,
``data/<stage>/_parts/`` and ``state/<stage>/<name>/``) that nothing references any more:

- referenced are the state handles (their files, the output parts they name and the data
  directories their JSON documents name) and the end_of_data manifests of every stage's current
  progress and final snapshot, of every retained checkpoint and savepoint (COMPLETED, read from
  their ``_metadata``) and of the acknowledgements of pending checkpoints (they become retained
  checkpoints when they complete);
- except: the output parts of a stage S that has downstream stages are needed only while one of
  them is not CLOSED, or a retained or pending checkpoint records one of them as not
  FULLY_FINISHED (a restore would re-read them). A stage without downstream stages keeps its
  parts: they are the pipeline's result, not intermediate data;
- a unit whose newest file is younger than the grace period is kept (a batch in flight in
  another process has not been recorded yet), and so is any unit of a RUNNING stage newer than
  that stage's last recorded batch (a batch that runs longer than the grace period).

Temporary files of atomic writes that a crash cut short (``.<name>.tmp-<hex>``, never read)
are deleted where their directory stays: inside kept units and inside ``chk-<id>/`` directories
(the only thing collection touches there), under the same grace and in-flight rules.

Deleting is idempotent and safe to run concurrently with other collectors and with running
stages: files that vanish meanwhile are fine. The scaffolding directories (``data/``,
``data/<stage>/``, ``data/<stage>/_parts/``, ``state/`` ...) are never removed, so a writer that
just created one never loses it. A retained checkpoint whose ``_metadata`` cannot be read (corrupt,
written by a newer version, I/O error) blocks the run: nothing is deleted, GcBlockedError says
why, because what it references is unknown.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsspec import AbstractFileSystem

from airflow_finalckpt.core.errors import (
    FinalCheckpointError,
    InvalidGraphError,
    MetadataError,
    StorageError,
    UnsafePathError,
)
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    OUTPUT_PREFIX,
    CheckpointRecord,
    CheckpointState,
    EndOfData,
    StageLifecycle,
    StageSnapshot,
    StageStatus,
    StateHandle,
    output_parts,
)
from airflow_finalckpt.core.ports import CoordinatorPort
from airflow_finalckpt.core.views import CheckpointInfo, StageView
from airflow_finalckpt.runtime.gc_files import (
    DATA_DIR,
    PARTS_DIR,
    STATE_DIR,
    RefIndex,
    Stats,
    StorageFiles,
    Unit,
    collect_temporaries,
    stage_of,
)
from airflow_finalckpt.runtime.gc_report import (
    GcBlockedError,
    GcEntry,
    GcReport,
    KeepReason,
    KeptEntry,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.bounded import read_json_document
from airflow_finalckpt.storage.paths import normalize_state_path

__all__ = [
    "DATA_DIR",
    "DEFAULT_GRACE_S",
    "PARTS_DIR",
    "STATE_DIR",
    "GcBlockedError",
    "GcEntry",
    "GcReport",
    "KeepReason",
    "KeptEntry",
    "collect_after_close",
    "collect_garbage",
]

log = logging.getLogger(__name__)

#: The fault harness (faults/proxies.py) patches ``_Files.remove`` to count deleted units.
_Files = StorageFiles

#: Files younger than this are never collected (a batch in flight elsewhere has not recorded them).
DEFAULT_GRACE_S = 600.0


# ---------------------------------------------------------------------------- references


@dataclass
class _Refs:
    """What is referenced, and by whom (for the report)."""

    paths: dict[str, set[str]] = field(default_factory=dict)
    #: stage id -> output part -> who names it
    parts: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, relpath: str, source: str) -> None:
        path = normalize_state_path(relpath)
        if path is None:
            self.notes.append(f"ignored invalid path {relpath!r} named by {source}")
            return
        self.paths.setdefault(path, set()).add(source)

    def add_part(self, stage_id: str, relpath: str, source: str) -> None:
        path = normalize_state_path(relpath)
        if path is None:
            self.notes.append(f"ignored invalid output part {relpath!r} named by {source}")
            return
        self.parts.setdefault(stage_id, {}).setdefault(path, set()).add(source)


class _Collector:
    def __init__(
        self, coordinator: CoordinatorPort, storage: CheckpointStorage, grace_s: float, now: float
    ) -> None:
        self.coordinator = coordinator
        self.storage = storage
        self.key = coordinator.pipeline_key
        self.fs: AbstractFileSystem = storage.fs
        self.base = str(self.fs._strip_protocol(storage.pipeline_dir(self.key))).rstrip("/")
        self.grace_s = grace_s
        self.now = now
        self.refs = _Refs()
        self._docs: dict[tuple[str, str], str | None] = {}

    # -- reading references ------------------------------------------------------------------

    def fs_path(self, relpath: str) -> str:
        return f"{self.base}/{relpath}"

    def _doc_path(self, handle: StateHandle) -> str | None:
        """The data directory a state handle's JSON document names (cached per file)."""
        cache_key = (handle.path, handle.sha256)
        if cache_key not in self._docs:
            found: str | None = None
            try:
                doc = read_json_document(self.fs, self.fs_path(handle.path), "state document")
                if isinstance(doc, dict) and isinstance(doc.get("path"), str):
                    found = doc["path"]
            except FileNotFoundError:
                self.refs.notes.append(
                    f"state handle {handle.name!r} file {handle.path} is missing"
                )
            except (ValueError, OSError, StorageError) as exc:
                self.refs.notes.append(
                    f"state handle {handle.name!r} file {handle.path} is unreadable: {exc}"
                )
            self._docs[cache_key] = found
        return self._docs[cache_key]

    def add_handles(
        self,
        stage_id: str,
        handles: Iterable[StateHandle],
        end_of_data: EndOfData | None,
        source: str,
    ) -> None:
        for handle in handles:
            self.refs.add(handle.path, source)
            if handle.name.startswith(OUTPUT_PREFIX):
                for part in output_parts(handle):
                    self.refs.add_part(stage_id, part, source)
                continue
            if handle.path.endswith(".json"):
                # Convention: the data directory sits beside its handle; keep it even if the
                # handle document cannot be read.
                self.refs.add(handle.path[: -len(".json")], source)
                doc_path = self._doc_path(handle)
                if doc_path is not None:
                    self.refs.add(doc_path, source)
        if end_of_data is not None:
            for part in end_of_data.manifest:
                self.refs.add_part(stage_id, part, f"{source} (end_of_data)")

    def add_snapshot(self, stage_id: str, snap: StageSnapshot, source: str) -> None:
        self.add_handles(stage_id, snap.state, snap.end_of_data, source)

    def add_live(self, views: Mapping[str, StageView]) -> None:
        for sid, view in views.items():
            self.add_snapshot(sid, view.progress, f"stage {sid} progress ({view.lifecycle})")
            if view.final_snapshot is not None:
                self.add_snapshot(sid, view.final_snapshot, f"stage {sid} final snapshot")

    def pending_acks(self) -> dict[int, dict[str, bool]]:
        """Snapshots pending checkpoints were acknowledged with (they will be recorded as is);
        returns checkpoint id -> stage id -> acknowledged by finish.
        """
        result: dict[int, dict[str, bool]] = {}
        for cid, sid, by_finish, snap in self.coordinator.pending_ack_snapshots():
            self.add_snapshot(sid, snap, f"pending checkpoint {cid} (acknowledged)")
            result.setdefault(cid, {})[sid] = by_finish
        return result

    def read_record(self, info: CheckpointInfo) -> CheckpointRecord | None:
        """A retained checkpoint's metadata; None (with a note) if it no longer exists."""
        label = f"{info.kind} {info.checkpoint_id}"
        path = info.metadata_path
        if path is None:
            self.refs.notes.append(f"{label} has no metadata file: nothing can restore from it")
            return None
        try:
            try:
                return self.storage.read_checkpoint(path)
            except UnsafePathError:
                # Restored from a path outside this storage root: read it where it is.
                return _storage_at(path).read_checkpoint(path)
        except MetadataError as exc:
            if not _exists(self.fs if "://" not in path else None, path):
                self.refs.notes.append(f"{label}: metadata {path} is gone (discarded)")
                return None
            raise GcBlockedError(
                f"cannot collect garbage of pipeline {self.key!r}: retained {label} at {path} "
                f"is unreadable, so what it references is unknown ({exc}); remove or repair it"
            ) from exc
        except FinalCheckpointError as exc:
            raise GcBlockedError(
                f"cannot collect garbage of pipeline {self.key!r}: retained {label} at {path} "
                f"cannot be read ({exc})"
            ) from exc


def _storage_at(path: str) -> CheckpointStorage:
    """A storage rooted two levels above a checkpoint directory (<root>/<key>/chk-<id>)."""
    chk_dir = posixpath.dirname(path) if path.rstrip("/").endswith("_metadata") else path
    root = posixpath.dirname(posixpath.dirname(chk_dir.rstrip("/"))) or "/"
    return CheckpointStorage(root)


def _exists(fs: AbstractFileSystem | None, path: str) -> bool:
    try:
        if fs is None:
            from fsspec.core import url_to_fs

            fs, path = url_to_fs(path)
        fs.invalidate_cache(path)
        return bool(fs.exists(path))
    except Exception:
        return True  # cannot tell: assume it exists (the conservative answer)


# ---------------------------------------------------------------------------- the collector


@dataclass(frozen=True)
class _Scan:
    """What the read phase found: the stages' two live reads and the referenced paths."""

    live_first: Mapping[str, StageView]
    live: Mapping[str, StageView]
    needed_by: Mapping[str, str]
    index: RefIndex

    def running(self) -> set[str]:
        """Stages RUNNING in either live read."""
        return {
            sid
            for views in (self.live_first, self.live)
            for sid, v in views.items()
            if v.lifecycle is StageLifecycle.RUNNING
        }


def _scan(coordinator: CoordinatorPort, col: _Collector, graph: StageGraph) -> _Scan:
    """Read every reference, in an order that is safe against concurrent progress.

    Live state, then the acknowledgements of pending checkpoints, then completed checkpoints,
    then live state again, then the acknowledgements and completed checkpoints once more. A
    snapshot that becomes referenced meanwhile is caught by a later read (or is newer than the
    grace period): a stage's state that was live only between the two live reads and was
    acknowledged there (its checkpoint completing after the first checkpoint read) is found by
    the reads after the second one.
    """
    live_first = coordinator.stages()
    col.add_live(live_first)
    pending_acks = col.pending_acks()
    records: list[tuple[CheckpointInfo, CheckpointRecord]] = []
    _read_completed(col, coordinator.checkpoints(), records)
    live = coordinator.stages()
    col.add_live(live)
    for cid, acked in col.pending_acks().items():
        pending_acks.setdefault(cid, {}).update(acked)
    infos = coordinator.checkpoints()
    _read_completed(col, infos, records)

    needed_by = _parts_needed(graph, live_first, live, records, infos, pending_acks, col.refs)
    referenced: dict[str, set[str]] = {p: set(s) for p, s in col.refs.paths.items()}
    for sid, parts in col.refs.parts.items():
        reason = needed_by.get(sid)
        if reason is None:
            continue
        for part, sources in parts.items():
            referenced.setdefault(part, set()).update(sources | {reason})
    return _Scan(live_first, live, needed_by, RefIndex(referenced))


@dataclass(frozen=True)
class _Judge:
    """Decides, unit by unit, what is kept and why."""

    index: RefIndex
    files: StorageFiles
    col: _Collector
    grace_s: float
    markers: Mapping[str, float | None]

    def keep(self, unit: Unit) -> KeptEntry | Stats | None:
        """A KeptEntry (kept, and why), the unit's stats (delete it), or None (it vanished)."""
        why = self.index.sources(unit.relpath)
        if why is not None:
            return KeptEntry(unit.relpath, KeepReason.REFERENCED, "; ".join(sorted(why)))
        stats = self.files.stats(unit)
        if stats.newest is None:
            if stats.files == 0 and not self.files.fs.exists(f"{self.col.base}/{unit.relpath}"):
                return None
            return KeptEntry(unit.relpath, KeepReason.GRACE, "modification time unknown")
        age = self.col.now - stats.newest
        if age < self.grace_s:
            return KeptEntry(
                unit.relpath,
                KeepReason.GRACE,
                f"modified {max(age, 0.0):.0f} s ago, grace period {self.grace_s:.0f} s",
            )
        stage = stage_of(unit.relpath)
        if stage is not None and stage in self.markers:
            marker = self.markers[stage]
            if marker is None or stats.newest >= marker:
                return KeptEntry(
                    unit.relpath,
                    KeepReason.IN_FLIGHT,
                    f"stage {stage} is RUNNING and this is newer than its last recorded "
                    "batch (a batch may be in flight)",
                )
        return stats


def _consumed_notes(col: _Collector, graph: StageGraph, needed_by: Mapping[str, str]) -> list[str]:
    notes = list(dict.fromkeys(col.refs.notes))
    for sid in sorted(col.refs.parts):
        if sid not in needed_by and graph.stages.get(sid) is not None and graph.downstream(sid):
            notes.append(
                f"output parts of stage {sid} are consumed: every downstream stage is CLOSED and "
                "no retained checkpoint needs them"
            )
    return notes


def collect_garbage(
    coordinator: CoordinatorPort,
    storage: CheckpointStorage,
    *,
    dry_run: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    clock: Callable[[], float] = time.time,
) -> GcReport:
    """Delete the intermediate outputs and superseded state nothing needs any more.

    See the module docstring for the rules. Raises UnknownPipelineError for an unregistered
    pipeline and GcBlockedError (deleting nothing) when a retained checkpoint is unreadable.
    """
    if grace_s < 0:
        raise ValueError(f"grace period must be >= 0 seconds, got {grace_s}")
    graph = coordinator.graph()
    col = _Collector(coordinator, storage, grace_s, clock())
    key = coordinator.pipeline_key
    scan = _scan(coordinator, col, graph)
    files = StorageFiles(col.fs, col.base)
    running = scan.running()
    markers = {
        sid: _last_recorded(files, scan.live.get(sid) or scan.live_first[sid]) for sid in running
    }
    judge = _Judge(scan.index, files, col, grace_s, markers)

    deleted: list[GcEntry] = []
    kept: list[KeptEntry] = []
    errors: list[str] = []
    units = files.units()
    for unit in units:
        verdict = judge.keep(unit)
        if verdict is None:
            continue  # vanished meanwhile
        if isinstance(verdict, KeptEntry):
            kept.append(verdict)
            continue
        entry = GcEntry(unit.relpath, unit.is_dir, verdict.files, verdict.bytes)
        if dry_run:
            deleted.append(entry)
            continue
        try:
            if files.remove(unit):
                deleted.append(entry)
        except OSError as exc:
            errors.append(f"cannot delete {unit.relpath}: {exc}")
    collect_temporaries(files, units, col.now, grace_s, running, markers, dry_run, deleted, errors)
    report = GcReport(
        pipeline_key=key,
        pipeline_dir=storage.pipeline_dir(key),
        dry_run=dry_run,
        grace_s=grace_s,
        deleted=tuple(deleted),
        kept=tuple(kept),
        notes=tuple(_consumed_notes(col, graph, scan.needed_by)),
        errors=tuple(errors),
    )
    log.debug("%s", report.summary())
    return report


def _read_completed(
    col: _Collector,
    infos: Iterable[CheckpointInfo],
    records: list[tuple[CheckpointInfo, CheckpointRecord]],
) -> None:
    """Add the handles of every COMPLETED checkpoint in ``infos`` not read yet to ``records``."""
    seen = {info.checkpoint_id for info, _ in records}
    for info in infos:
        if info.state is not CheckpointState.COMPLETED or info.checkpoint_id in seen:
            continue
        record = col.read_record(info)
        if record is None:
            continue
        records.append((info, record))
        label = f"{info.kind} {info.checkpoint_id}"
        for sid, rec in record.stages.items():
            col.add_handles(sid, rec.state, rec.end_of_data, label)


def _last_recorded(files: StorageFiles, view: StageView) -> float | None:
    """When a running stage last recorded a batch: the newest of its live handle files."""
    times = [files.mtime(h.path) for h in view.progress.state]
    known = [x for x in times if x is not None]
    return max(known) if known else None


def _parts_needed(
    graph: StageGraph,
    live_first: Mapping[str, StageView],
    live: Mapping[str, StageView],
    records: list[tuple[CheckpointInfo, CheckpointRecord]],
    infos: list[CheckpointInfo],
    pending_acks: Mapping[int, Mapping[str, bool]],
    refs: _Refs,
) -> dict[str, str]:
    """Stage id -> why its output parts are still needed; stages absent here are consumed.

    Stages without downstream stages in the current graph always keep their parts.
    """
    record_graphs: list[StageGraph] = []
    for info, record in records:
        try:
            record_graphs.append(StageGraph.from_dict(record.graph))
        except InvalidGraphError as exc:
            refs.notes.append(f"{info.kind} {info.checkpoint_id}: unreadable graph ({exc})")
    needed: dict[str, str] = {}
    for sid in refs.parts:
        if sid not in graph or not graph.downstream(sid):
            needed[sid] = f"output of {sid}, which has no downstream stage: not intermediate"
            continue
        downstream = set(graph.downstream(sid))
        for g in record_graphs:
            if sid in g:
                downstream |= set(g.downstream(sid))
        reason = _why_needed(
            sorted(downstream), graph, live_first, live, records, infos, pending_acks
        )
        if reason is not None:
            needed[sid] = f"output of {sid} needed by {reason}"
    return needed


def _why_needed(
    downstream: list[str],
    graph: StageGraph,
    live_first: Mapping[str, StageView],
    live: Mapping[str, StageView],
    records: list[tuple[CheckpointInfo, CheckpointRecord]],
    infos: list[CheckpointInfo],
    pending_acks: Mapping[int, Mapping[str, bool]],
) -> str | None:
    """Why a stage's output parts are still needed by one of its ``downstream`` stages (the
    live pipeline first: the most telling reason), None if by none.
    """
    return (
        _needed_live(downstream, graph, (live_first, live))
        or _needed_by_records(downstream, graph, records)
        or _needed_by_pending(downstream, graph, infos, pending_acks)
    )


def _needed_live(
    downstream: list[str], graph: StageGraph, reads: tuple[Mapping[str, StageView], ...]
) -> str | None:
    for down in downstream:
        if down not in graph:
            continue
        for views in reads:
            view = views.get(down)
            lifecycle = view.lifecycle if view is not None else StageLifecycle.NOT_STARTED
            if lifecycle is not StageLifecycle.CLOSED:
                return f"{down} ({lifecycle})"
    return None


def _needed_by_records(
    downstream: list[str],
    graph: StageGraph,
    records: list[tuple[CheckpointInfo, CheckpointRecord]],
) -> str | None:
    """A restore of a retained checkpoint re-reads the parts."""
    for info, record in records:
        for down in downstream:
            rec = record.stages.get(down)
            if rec is None and down in graph:
                return f"{down} (not in {info.kind} {info.checkpoint_id}: a restore starts it)"
            if rec is not None and rec.status is not StageStatus.FULLY_FINISHED:
                return f"{down} ({rec.status} in {info.kind} {info.checkpoint_id})"
    return None


def _needed_by_pending(
    downstream: list[str],
    graph: StageGraph,
    infos: list[CheckpointInfo],
    pending_acks: Mapping[int, Mapping[str, bool]],
) -> str | None:
    """So will a restore of a pending checkpoint, once it completes."""
    for info in infos:
        if info.state is not CheckpointState.PENDING:
            continue
        acked_by_finish = pending_acks.get(info.checkpoint_id, {})
        for down in downstream:
            status = info.plan.statuses.get(down)
            if status is None and down in graph:
                return f"{down} (not in pending checkpoint {info.checkpoint_id})"
            if (
                status is not None
                and status is not StageStatus.FULLY_FINISHED
                and not acked_by_finish.get(down, False)
            ):
                return f"{down} ({status} in pending checkpoint {info.checkpoint_id})"
    return None


# ---------------------------------------------------------------------------- after close


def collect_after_close(coordinator: CoordinatorPort, logic: object, stage_log: Any = None) -> None:
    """Run a collection after a stage closed; never raises (a failure is logged as a warning).

    The storage is the coordinator's checkpoint writer, else the stage logic's ``storage``.
    """
    target = stage_log if stage_log is not None else log
    try:
        storage = coordinator.writer
        if not isinstance(storage, CheckpointStorage):
            storage = getattr(logic, "storage", None)
        if not isinstance(storage, CheckpointStorage):
            return
        report = collect_garbage(coordinator, storage)
        if report.deleted or report.errors:
            target.info("%s", report.summary())
    except Exception as exc:
        warn = getattr(target, "warning", None)
        message = "garbage collection of pipeline %s after close failed (ignored): %s"
        if callable(warn):
            warn(message, coordinator.pipeline_key, exc)
        else:
            log.warning(message, coordinator.pipeline_key, exc)
