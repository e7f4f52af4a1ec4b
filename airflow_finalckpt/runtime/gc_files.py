"""The pipeline directory as garbage collection sees it: its layout, its *units* (what one
collection deletes whole), their sizes and ages, and the index of referenced paths. Plain file
system work over fsspec; what is referenced is decided in ``runtime.gc``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fsspec import AbstractFileSystem

from airflow_finalckpt.runtime.gc_report import GcEntry
from airflow_finalckpt.storage.atomic import TEMP_MARKER
from airflow_finalckpt.storage.paths import parse_checkpoint_dir_name

DATA_DIR = "data"
STATE_DIR = "state"
PARTS_DIR = "_parts"
ROOTS = (DATA_DIR, STATE_DIR)


@dataclass(frozen=True)
class Unit:
    """What one collection deletes whole: an entry below the layout's directories."""

    relpath: str
    is_dir: bool


@dataclass(frozen=True)
class Stats:
    """A unit's file count, bytes and newest modification time (None: not known)."""

    files: int
    bytes: int
    newest: float | None


def mtime_of(info: Mapping[str, Any]) -> float | None:
    """The modification time in an fsspec info dict, whatever the backend calls it."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def is_scaffolding(parts: tuple[str, ...]) -> bool:
    """Directories of the layout itself: listed, never deleted."""
    if parts[0] == DATA_DIR:
        return len(parts) <= 2 or (len(parts) == 3 and parts[2] == PARTS_DIR)
    return parts[0] == STATE_DIR and len(parts) <= 3


def stage_of(relpath: str) -> str | None:
    """The stage a path under ``data/`` or ``state/`` belongs to."""
    parts = relpath.split("/")
    return parts[1] if len(parts) >= 3 and parts[0] in ROOTS else None


class StorageFiles:
    """The units of one pipeline directory on its file system."""

    def __init__(self, fs: AbstractFileSystem, base: str) -> None:
        self.fs = fs
        self.base = base

    def _ls(self, fs_path: str) -> list[dict[str, Any]]:
        try:
            return list(self.fs.ls(fs_path, detail=True))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def units(self) -> list[Unit]:
        """Every unit below the layout's directories, by path."""
        self.fs.invalidate_cache(self.base)
        found: list[Unit] = []
        todo = list(ROOTS)
        while todo:
            rel = todo.pop()
            for info in self._ls(f"{self.base}/{rel}"):
                name = posixpath.basename(str(info["name"]).rstrip("/"))
                if name in ("", ".", ".."):
                    continue
                child = f"{rel}/{name}"
                is_dir = info.get("type") == "directory"
                if is_dir and is_scaffolding(tuple(child.split("/"))):
                    todo.append(child)
                else:
                    found.append(Unit(child, is_dir))
        return sorted(found, key=lambda u: u.relpath)

    def stats(self, unit: Unit) -> Stats:
        """Files, bytes and newest modification time of a unit (a directory: of everything
        in it).
        """
        fs_path = f"{self.base}/{unit.relpath}"
        try:
            own = self.fs.info(fs_path)
        except FileNotFoundError:
            return Stats(0, 0, None)
        if not unit.is_dir:
            return Stats(1, int(own.get("size") or 0), mtime_of(own))
        try:
            entries = self.fs.find(fs_path, withdirs=True, detail=True)
        except FileNotFoundError:
            entries = {}
        # Directories on object stores have no modification time: only files must have one.
        dir_times = [mtime_of(own)]
        file_times: list[float | None] = []
        files = size = 0
        for info in entries.values():
            if info.get("type") == "directory":
                dir_times.append(mtime_of(info))
            else:
                files += 1
                size += int(info.get("size") or 0)
                file_times.append(mtime_of(info))
        if any(x is None for x in file_times):
            return Stats(files, size, None)
        known = [x for x in (*dir_times, *file_times) if x is not None]
        return Stats(files, size, max(known) if known else None)

    def fs_path(self, relpath: str) -> str:
        """The file system path of a path relative to the pipeline directory."""
        return f"{self.base}/{relpath}"

    def temporaries(self) -> list[tuple[str, dict[str, Any]]]:
        """Temporary files of atomic writes under ``data/``, ``state/`` and ``chk-<id>/``
        (relative path, info), from one recursive listing of the pipeline directory.
        """
        try:
            found = self.fs.find(self.base, detail=True)
        except FileNotFoundError:
            return []
        result = []
        for name, info in found.items():
            path = str(name).rstrip("/")
            if not path.startswith(self.base + "/") or info.get("type") == "directory":
                continue
            relpath = path[len(self.base) + 1 :]
            top = relpath.split("/", 1)[0]
            if TEMP_MARKER not in posixpath.basename(relpath):
                continue
            if top in ROOTS or parse_checkpoint_dir_name(top) is not None:
                result.append((relpath, info))
        return sorted(result, key=lambda item: item[0])

    def mtime(self, relpath: str) -> float | None:
        """A file's modification time; None if it is gone or has none."""
        try:
            return mtime_of(self.fs.info(f"{self.base}/{relpath}"))
        except FileNotFoundError:
            return None

    def remove(self, unit: Unit) -> bool:
        """Delete a unit; False if it was already gone (another collector was faster)."""
        fs_path = f"{self.base}/{unit.relpath}"
        for _attempt in range(3):
            try:
                if unit.is_dir:
                    self.fs.rm(fs_path, recursive=True)
                else:
                    self.fs.rm_file(fs_path)
                return True
            except FileNotFoundError:
                # Deleted concurrently, wholly or in part: done once it no longer exists.
                self.fs.invalidate_cache(fs_path)
                if not self.fs.exists(fs_path):
                    return False
        self.fs.rm(fs_path, recursive=unit.is_dir)
        return True


class RefIndex:
    """Referenced paths with their sources; answers "is this unit referenced?" in O(depth)."""

    def __init__(self, referenced: Mapping[str, set[str]]) -> None:
        self.exact = referenced
        #: a directory -> sources of the references below it
        self.below: dict[str, set[str]] = {}
        for path, sources in referenced.items():
            parts = path.split("/")
            for depth in range(1, len(parts)):
                self.below.setdefault("/".join(parts[:depth]), set()).update(sources)

    def sources(self, relpath: str) -> set[str] | None:
        """Sources of every reference equal to, inside or containing ``relpath``."""
        found = set(self.exact.get(relpath, ())) | self.below.get(relpath, set())
        parts = relpath.split("/")
        for depth in range(1, len(parts)):
            found |= self.exact.get("/".join(parts[:depth]), set())
        return found or None


def collect_temporaries(
    files: StorageFiles,
    units: list[Unit],
    now: float,
    grace_s: float,
    running: set[str],
    markers: Mapping[str, float | None],
    dry_run: bool,
    deleted: list[GcEntry],
    errors: list[str],
) -> None:
    """Delete the temporary files of atomic writes that a crash cut short
    (``.<name>.tmp-<hex>``) inside what is kept: a referenced output part or state directory,
    a checkpoint directory. Nothing reads them (readers only look at final names); they go once
    older than the grace period, unless their stage is RUNNING and they are newer than its last
    recorded batch (a write may be in flight). Temporary files that are units themselves, or
    inside units deleted above, are already dealt with.
    """
    unit_paths = {u.relpath for u in units}
    gone = {e.path for e in deleted}
    for relpath, info in files.temporaries():
        parts = relpath.split("/")
        if relpath in unit_paths or any("/".join(parts[:d]) in gone for d in range(1, len(parts))):
            continue
        mtime = mtime_of(info)
        if mtime is None or now - mtime < grace_s:
            continue
        stage = stage_of(relpath)
        if stage in running:
            marker = markers.get(stage)
            if marker is None or mtime >= marker:
                continue
        entry = GcEntry(relpath, False, 1, int(info.get("size") or 0))
        if dry_run:
            deleted.append(entry)
            continue
        try:
            files.fs.rm_file(files.fs_path(relpath))
            deleted.append(entry)
        except FileNotFoundError:
            pass  # removed concurrently
        except OSError as exc:
            errors.append(f"cannot delete {relpath}: {exc}")
