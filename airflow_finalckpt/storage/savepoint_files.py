"""Self-contained savepoints: the files a savepoint references, kept inside its directory.

A checkpoint's ``_metadata`` names state handles, output parts and end_of_data manifests by paths
relative to the pipeline directory (``<root>/<pipeline_key>/...``). Periodic checkpoints leave
it at that (they stay cheap, and never leave their pipeline directory). A savepoint is meant to
travel: when one completes, checkpoint storage also puts every file it references under its own
directory, before ``_metadata`` (so a complete savepoint always has them)::

    <root>/<key>/chk-<id>/_metadata                the record (format unchanged)
    <root>/<key>/chk-<id>/_files.json              relative path -> size, sha256 of each file
    <root>/<key>/chk-<id>/files/<relative path>    the files, by their pipeline-relative path

What is kept: every stage's state handle files, the data directories beside them (keyed and
stage-global state frames, and the directory each handle document names), the output parts the
output handles name, and the parts of every end_of_data manifest (a downstream stage that is not
fully finished, or one added on restore, reads them). Anything else under the pipeline directory
(superseded state, parts consumed by finished stages) stays behind.

On a local filesystem the files are hard links (no bytes copied; safe because every writer
replaces files by rename or rewrites a directory, never edits a file in place, so the linked
inode never changes); elsewhere fsspec's ``copy`` (a server-side copy on object stores).

Restoring (:func:`materialize`, called by the coordinator for every start from a savepoint):
each listed file missing from the pipeline directory the restore runs in is copied there from
the savepoint directory after its size and sha256 are checked. So copying ONLY ``chk-<id>/`` to
another storage root (another cluster) is enough, and a restore in place copies nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import shutil
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from airflow_finalckpt.core.errors import StorageError, UnsafePathError
from airflow_finalckpt.core.model import (
    OUTPUT_PREFIX,
    CheckpointKind,
    CheckpointRecord,
    StateHandle,
    output_parts,
)
from airflow_finalckpt.storage.atomic import TEMP_MARKER, atomic_write
from airflow_finalckpt.storage.bounded import MAX_DOCUMENT_BYTES, read_capped, read_json_document
from airflow_finalckpt.storage.paths import METADATA_FILE_NAME, normalize_state_path


class _Location(Protocol):
    @property
    def checkpoint_dir(self) -> str: ...


class CheckpointStorage(Protocol):
    """What the savepoint copies use of ``storage.checkpoint_storage.CheckpointStorage`` (a
    Protocol, so that module can call this one without this one importing it back).
    """

    fs: AbstractFileSystem

    def pipeline_dir(self, pipeline_key: str) -> str:
        """The pipeline's directory (a public URI or path)."""
        ...

    def locate(self, path: str) -> _Location:
        """Where the checkpoint at a user-supplied path lives."""
        ...

    def _public(self, fs_path: str) -> str: ...


log = logging.getLogger(__name__)

FILES_MANIFEST = "_files.json"
FILES_DIR = "files"
MANIFEST_FORMAT = "airflow-finalckpt/savepoint-files"
MANIFEST_VERSION = 1
_CHUNK = 1 << 20

#: Savepoints travel; periodic checkpoints stay cheap, and a drained savepoint cannot be
#: restored (its windows already fired), so neither holds copies.
SELF_CONTAINED_KINDS = frozenset({CheckpointKind.SAVEPOINT})


def is_self_contained_kind(record: CheckpointRecord) -> bool:
    """Savepoints carry copies of their files, so their path alone restores them."""
    return record.kind in SELF_CONTAINED_KINDS


# -- what a record references -----------------------------------------------------------------


def _handle_refs(handle: StateHandle) -> list[str]:
    refs = [handle.path]
    if handle.name.startswith(OUTPUT_PREFIX):
        refs += output_parts(handle)
    elif handle.path.endswith(".json"):
        refs.append(handle.path[: -len(".json")])  # the data directory beside its handle
    return refs


def referenced_paths(record: CheckpointRecord) -> list[str]:
    """Pipeline-relative paths (files or directories) the record names directly, sorted."""
    found: set[str] = set()
    for stage in record.stages.values():
        for handle in stage.state:
            found.update(p for p in map(normalize_state_path, _handle_refs(handle)) if p)
        if stage.end_of_data is not None:
            found.update(p for p in map(normalize_state_path, stage.end_of_data.manifest) if p)
    return sorted(found)


def _doc_paths(fs: AbstractFileSystem, base: str, record: CheckpointRecord) -> list[str]:
    """The data directories the state handle documents name (``{"path": ...}``)."""
    found: list[str] = []
    for stage in record.stages.values():
        for handle in stage.state:
            if handle.name.startswith(OUTPUT_PREFIX) or not handle.path.endswith(".json"):
                continue
            try:
                doc = read_json_document(fs, f"{base}/{handle.path}", "state document")
            except (OSError, ValueError, StorageError):
                continue  # a missing handle file is reported by its own entry
            path = normalize_state_path(doc.get("path")) if isinstance(doc, dict) else None
            if path:
                found.append(path)
    return found


def _files_under(fs: AbstractFileSystem, base: str, relpath: str) -> Iterator[str]:
    """Every file at or under ``base/relpath`` (relative to base); nothing if it is absent."""
    full = f"{base}/{relpath}"
    if fs.isfile(full):
        yield relpath
        return
    if not fs.isdir(full):
        return
    for path in sorted(fs.find(full)):
        rel = str(path)[len(base) + 1 :] if str(path).startswith(base + "/") else None
        if rel and TEMP_MARKER not in posixpath.basename(rel):
            yield rel


# -- writing (at savepoint completion) -------------------------------------------------------


def _sha256_of(fs: AbstractFileSystem, path: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def refuse_link_out(fs: AbstractFileSystem, path: str, root: str) -> None:
    """A local file reached through a symlink (itself or a directory above it, up to
    ``root``) could be anything on the machine: never read, copied or bundled.
    """
    if not isinstance(fs, LocalFileSystem):
        return
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    if os.path.islink(path) or not real.startswith(real_root + os.sep):
        raise UnsafePathError(
            f"{path} is a symlink or lies under one inside the checkpoint storage: refused "
            "(checkpoint storage holds plain files only)"
        )


def _place(fs: AbstractFileSystem, src: str, dst: str) -> None:
    """Put ``src``'s bytes at ``dst`` on the same filesystem: a hard link if possible."""
    if isinstance(fs, LocalFileSystem):
        os.makedirs(posixpath.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
            return
        except OSError:
            shutil.copyfile(src, dst)  # no hard links here (another device, a FAT share...)
            return
    fs.makedirs(posixpath.dirname(dst), exist_ok=True)
    fs.copy(src, dst)


def manifest_checksum(files: dict[str, Any]) -> str:
    """The sha256 of a savepoint's file list, in canonical JSON."""
    canonical = json.dumps(files, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def bundle(storage: CheckpointStorage, record: CheckpointRecord, fs_dir: str) -> int:
    """Put every file the savepoint references into ``fs_dir/files/`` and write the manifest;
    returns the number of files. Call before ``_metadata`` is written.
    """
    fs = storage.fs
    base = str(fs._strip_protocol(storage.pipeline_dir(record.pipeline_key))).rstrip("/")
    fs.invalidate_cache(base)
    roots = sorted({*referenced_paths(record), *_doc_paths(fs, base, record)})
    files: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    try:
        for relpath in roots:
            found = list(_files_under(fs, base, relpath))
            if not found:
                missing.append(relpath)
            for rel in found:
                if rel in files:
                    continue
                target = f"{fs_dir}/{FILES_DIR}/{rel}"
                refuse_link_out(fs, f"{base}/{rel}", base)
                _place(fs, f"{base}/{rel}", target)
                size, sha = _sha256_of(fs, target)
                files[rel] = {"size": size, "sha256": sha}
        document = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "pipeline_key": record.pipeline_key,
            "checkpoint_id": record.checkpoint_id,
            "files": files,
            "missing": missing,
            "sha256": manifest_checksum(files),
        }
        data = (json.dumps(document, indent=1, sort_keys=True) + "\n").encode("ascii")
        atomic_write(fs, f"{fs_dir}/{FILES_MANIFEST}", data)
    except OSError as exc:
        raise StorageError(
            f"cannot copy the files of savepoint {record.checkpoint_id} of pipeline "
            f"{record.pipeline_key!r} into {storage._public(fs_dir)}: {exc}"
        ) from exc
    if missing:
        log.warning(
            "savepoint %d of pipeline %r references paths that do not exist: %s",
            record.checkpoint_id,
            record.pipeline_key,
            ", ".join(missing),
        )
    return len(files)


# -- restoring ------------------------------------------------------------------------------


def _source_dir(storage: CheckpointStorage, source: str) -> tuple[AbstractFileSystem, str]:
    """The filesystem and fs path of the savepoint directory ``source`` names."""
    try:
        location = storage.locate(source)
        fs_dir = str(storage.fs._strip_protocol(location.checkpoint_dir)).rstrip("/")
        return storage.fs, fs_dir
    except UnsafePathError:
        fs, path = url_to_fs(source)  # restored from outside this storage root: read it there
        path = str(path).rstrip("/")
        if posixpath.basename(path) == METADATA_FILE_NAME:
            path = posixpath.dirname(path)
        return fs, path


def read_manifest(fs: AbstractFileSystem, fs_dir: str, where: str) -> dict[str, Any] | None:
    """The savepoint's file list (None for a checkpoint without one); StorageError if corrupt."""
    try:
        path = f"{fs_dir}/{FILES_MANIFEST}"
        raw = read_capped(fs, path, MAX_DOCUMENT_BYTES, what="the savepoint's file list")
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
        files = doc["files"]
        ok = (
            doc.get("format") == MANIFEST_FORMAT
            and isinstance(files, dict)
            and doc.get("sha256") == manifest_checksum(files)
        )
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise StorageError(
            f"the file list {where}/{FILES_MANIFEST} of the savepoint is corrupt (bad JSON, "
            "format or checksum); copy the savepoint directory again"
        )
    if doc.get("version") != MANIFEST_VERSION:
        raise StorageError(
            f"the file list {where}/{FILES_MANIFEST} has version {doc.get('version')!r}, "
            f"this airflow-finalckpt reads version {MANIFEST_VERSION}; upgrade airflow-finalckpt"
        )
    return dict(files)


def materialize(storage: CheckpointStorage, record: CheckpointRecord, source: str) -> int:
    """Copy the savepoint's files that the pipeline directory lacks into it, verified against
    their size and sha256; returns how many were copied. Idempotent and safe to run from
    several tasks at once (every file is written atomically). A checkpoint without a file list
    (periodic checkpoints, savepoints of older versions) copies nothing.
    """
    src_fs, src_dir = _source_dir(storage, source)
    where = source.rstrip("/")
    if posixpath.basename(where) == METADATA_FILE_NAME:
        where = posixpath.dirname(where)
    src_fs.invalidate_cache(src_dir)
    files = read_manifest(src_fs, src_dir, where)
    if not files:
        return 0
    fs = storage.fs
    base = str(fs._strip_protocol(storage.pipeline_dir(record.pipeline_key))).rstrip("/")
    fs.invalidate_cache(base)
    copied = 0
    for rel in sorted(files):
        entry = files[rel]
        clean = normalize_state_path(rel)
        if clean is None or clean != rel:
            raise StorageError(f"the file list {where}/{FILES_MANIFEST} names unsafe path {rel!r}")
        target = f"{base}/{rel}"
        if fs.exists(target):
            continue
        copied += _copy_verified(src_fs, f"{src_dir}/{FILES_DIR}/{rel}", fs, target, entry, where)
    if copied:
        log.info(
            "restore from %s: copied %d of its %d files into %s",
            where,
            copied,
            len(files),
            storage.pipeline_dir(record.pipeline_key),
        )
    return copied


def _copy_verified(
    src_fs: AbstractFileSystem,
    src: str,
    fs: AbstractFileSystem,
    target: str,
    entry: dict[str, Any],
    where: str,
) -> int:
    size = entry.get("size")
    try:  # never more than the file list records: a larger file is refused unread
        limit = size if type(size) is int and size >= 0 else 0
        data = read_capped(src_fs, src, limit, what=f"savepoint file (listed in {where})")
    except FileNotFoundError:
        raise StorageError(
            f"savepoint {where} lists {src.rsplit(f'/{FILES_DIR}/', 1)[-1]} but its copy "
            f"{src} is missing; copy the whole savepoint directory"
        ) from None
    except OSError as exc:
        raise StorageError(f"cannot read {src}: {exc}") from exc
    if len(data) != entry.get("size") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise StorageError(
            f"savepoint file {src} does not match its checksum in {where}/{FILES_MANIFEST} "
            f"(expected {entry.get('size')} bytes, sha256 {entry.get('sha256')}); the copy is "
            "corrupt or was edited"
        )
    try:
        atomic_write(fs, target, data)
    except OSError as exc:
        raise StorageError(f"cannot write {target}: {exc}") from exc
    return 1


def bundled_files(storage: CheckpointStorage, savepoint_path: str) -> Iterable[str]:
    """The pipeline-relative paths a savepoint holds copies of (empty without a file list)."""
    src_fs, src_dir = _source_dir(storage, savepoint_path)
    return sorted(read_manifest(src_fs, src_dir, savepoint_path) or {})
