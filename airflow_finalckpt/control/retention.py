"""Retention: remove whole pipelines that ``core.retention`` says are done with.

Removing one pipeline deletes, in this order, its files under ``<root>/<pipeline_key>/``
(checkpoints, ``state/``, ``data/``, temporary leftovers of atomic writes; a savepoint's
``chk-<id>/`` only with ``savepoints=True``: savepoints are self-contained, so a kept one
still restores into an empty store) and then its rows in every table of the coordination
store. Files go first: a failure half-way leaves the rows, so the next gc finds and finishes it.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from airflow_finalckpt.core.retention import ExpiryReason, PipelineAge, expires_at, expiry
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.paths import CHECKPOINT_DIR_PREFIX
from airflow_finalckpt.store.pipelines import (
    PipelineRow,
    count_pipeline_rows,
    delete_pipeline_rows,
    pipeline_rows,
    savepoint_ids,
)

log = logging.getLogger(__name__)

#: (dag_id, run_id) -> does Airflow still have that DAG run (None: cannot tell)
RunExists = Callable[[str, str], bool | None]


@dataclass(frozen=True)
class Removal:
    """What removing one pipeline deleted (or, in a dry run, would delete)."""

    pipeline_key: str
    reason: str
    paths: tuple[str, ...]
    files: int
    bytes: int
    kept_savepoints: tuple[str, ...]
    store_rows: int
    errors: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """As ``finalckpt gc --json`` prints it."""
        return {
            "pipeline_key": self.pipeline_key,
            "reason": self.reason,
            "paths": list(self.paths),
            "files": self.files,
            "bytes": self.bytes,
            "kept_savepoints": list(self.kept_savepoints),
            "store_rows": self.store_rows,
            "errors": list(self.errors),
        }


@dataclass(frozen=True)
class RetentionReport:
    """One retention pass: the pipelines removed and those kept (with when they expire)."""

    dry_run: bool
    retention_days: float
    removed: tuple[Removal, ...] = ()
    kept: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def errors(self) -> list[str]:
        """Every error of every removal."""
        return [e for r in self.removed for e in r.errors]

    def summary(self) -> str:
        """One line for a log or a terminal."""
        verb = "would remove" if self.dry_run else "removed"
        files = sum(r.files for r in self.removed)
        size = sum(r.bytes for r in self.removed)
        rows = sum(r.store_rows for r in self.removed)
        return (
            f"retention (retention_days={self.retention_days:g}): {verb} "
            f"{len(self.removed)} pipelines ({files} files, {size} bytes, {rows} store rows), "
            f"kept {len(self.kept)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """As ``finalckpt gc --json`` prints it."""
        return {
            "dry_run": self.dry_run,
            "retention_days": self.retention_days,
            "removed": [r.to_dict() for r in self.removed],
            "kept": list(self.kept),
            "notes": list(self.notes),
            "errors": self.errors,
        }


def age_of(row: PipelineRow, run_exists: RunExists | None) -> PipelineAge:
    """What the retention rule needs of a stored pipeline (asking Airflow about its runs)."""
    exists: list[bool | None] = [None] * len(row.dag_runs)  # not asked
    if run_exists is not None:
        exists = [run_exists(dag_id, run_id) for dag_id, run_id in row.dag_runs]
    superseded = row.superseded_by is not None
    return PipelineAge(row.pipeline_key, row.closed, row.last_change, tuple(exists), superseded)


def _pipeline_fs_dir(storage: CheckpointStorage, key: str) -> str:
    return str(storage.fs._strip_protocol(storage.pipeline_dir(key))).rstrip("/")


def _savepoint_dir_names(engine: Engine, key: str) -> set[str]:
    return {f"{CHECKPOINT_DIR_PREFIX}{i}" for i in savepoint_ids(engine, key)}


def remove_pipeline(
    engine: Engine,
    storage: CheckpointStorage,
    key: str,
    reason: str,
    *,
    dry_run: bool = False,
    savepoints: bool = False,
) -> Removal:
    """Delete one pipeline's files (savepoints only if asked), then its store rows."""
    fs = storage.fs
    base = _pipeline_fs_dir(storage, key)
    keep = set() if savepoints else _savepoint_dir_names(engine, key)
    paths: list[str] = []
    kept: list[str] = []
    files = size = 0
    errors: list[str] = []
    try:
        entries = sorted(fs.ls(base, detail=False)) if fs.exists(base) else []
    except FileNotFoundError:
        entries = []
    for entry in entries:
        name = posixpath.basename(str(entry).rstrip("/"))
        if name in keep:
            kept.append(name)
            continue
        found = fs.find(entry, detail=True) if fs.isdir(entry) else {entry: fs.info(entry)}
        files += len(found)
        size += sum(int(info.get("size") or 0) for info in found.values())
        paths.append(name)
        if dry_run:
            continue
        try:
            fs.rm(entry, recursive=True)
        except FileNotFoundError:
            pass  # removed meanwhile by a concurrent gc
        except OSError as exc:
            errors.append(f"cannot delete {key}/{name}: {exc}")
    if not dry_run and not kept and not errors:
        with contextlib.suppress(OSError):  # an empty directory left is harmless
            fs.rm(base, recursive=True)
    rows = count_pipeline_rows(engine, key)
    if not dry_run and not errors:
        rows = delete_pipeline_rows(engine, key)
    return Removal(key, reason, tuple(paths), files, size, tuple(kept), rows, tuple(errors))


def preview_expiry(
    engine: Engine, storage: CheckpointStorage, key: str, savepoints: bool
) -> dict[str, Any]:
    """What removing a kept pipeline would delete once it expires (nothing is deleted)."""
    removal = remove_pipeline(
        engine, storage, key, ExpiryReason.EXPIRED.value, dry_run=True, savepoints=savepoints
    )
    return removal.to_dict()


def apply_retention(
    engine: Engine,
    storage: CheckpointStorage,
    *,
    retention_days: float,
    dry_run: bool = False,
    savepoints: bool = False,
    run_exists: RunExists | None = None,
    keys: Sequence[str] | None = None,
    clock: Callable[[], float] = time.time,
) -> RetentionReport:
    """Remove every pipeline (of ``keys`` if given) the retention rule expires now."""
    now = clock()
    removed: list[Removal] = []
    kept: list[dict[str, Any]] = []
    # every question to Airflow first: an unreachable api-server fails before anything is gone
    aged = [(row, age_of(row, run_exists)) for row in pipeline_rows(engine, keys)]
    for row, age in aged:
        reason = expiry(age, now, retention_days)
        if reason is None:
            deadline = expires_at(age, retention_days)
            kept.append(
                {
                    "pipeline_key": row.pipeline_key,
                    "closed": row.closed,
                    "expires_at": deadline,
                    "why": "open: a retry, clear or resume may continue it"
                    if deadline is None
                    else f"closed, kept for {retention_days:g} days after its last change",
                }
            )
            continue
        removal = remove_pipeline(
            engine, storage, row.pipeline_key, reason.value, dry_run=dry_run, savepoints=savepoints
        )
        if not dry_run:
            log.info(
                "retention removed pipeline %s (%s): %d files, %d store rows",
                row.pipeline_key,
                reason.value,
                removal.files,
                removal.store_rows,
            )
        removed.append(removal)
    notes: tuple[str, ...] = ()
    if run_exists is None:
        notes = ("DAG runs were not checked against Airflow (pass --check-dag-runs)",)
    return RetentionReport(dry_run, retention_days, tuple(removed), tuple(kept), notes)


__all__ = [
    "ExpiryReason",
    "Removal",
    "RetentionReport",
    "RunExists",
    "age_of",
    "apply_retention",
    "preview_expiry",
    "remove_pipeline",
]
