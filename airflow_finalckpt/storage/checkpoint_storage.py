"""Checkpoint storage on any fsspec filesystem.

Layout under the root::

    <root>/<pipeline_key>/chk-<id>/_metadata      checkpoints and savepoints (kind is inside)
    <root>/<pipeline_key>/<state path>             state and staged files, StateHandle.path

StateHandle paths are relative to the pipeline directory, so a pipeline directory can be copied
to another root (another cluster) and restored from there. A savepoint also holds a copy of every
file it references (``chk-<id>/files/``, listed with checksums in ``chk-<id>/_files.json``, see
:mod:`~airflow_finalckpt.storage.savepoint_files`): its directory alone is enough to restore.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs

from airflow_finalckpt.core.errors import (
    ConfigurationError,
    FinalCheckpointError,
    MetadataError,
    StorageError,
    UnsafePathError,
)
from airflow_finalckpt.core.metadata import dump_metadata, load_metadata_versioned
from airflow_finalckpt.core.metadata.registry import MAX_METADATA_BYTES
from airflow_finalckpt.core.model import CheckpointRecord, StateHandle
from airflow_finalckpt.storage import savepoint_files
from airflow_finalckpt.storage.atomic import atomic_write, protocols_of
from airflow_finalckpt.storage.bounded import MAX_DOCUMENT_BYTES, read_capped
from airflow_finalckpt.storage.paths import (
    METADATA_FILE_NAME,
    checkpoint_dir_name,
    parse_checkpoint_dir_name,
    validate_pipeline_key,
    validate_state_path,
)

#: Advisory files shared across the runs of a scope (e.g. a stage's measured batch throughput);
#: never a pipeline directory, since a pipeline key cannot start with '='.
HINTS_DIR = "=hints"


class _LargerFileError(StorageError):
    """An existing file is larger than the one about to replace it (so it differs)."""


@dataclass(frozen=True)
class CheckpointLocation:
    """Where a checkpoint lives, parsed from a user-supplied path and rebuilt from its parts."""

    pipeline_key: str
    checkpoint_id: int
    checkpoint_dir: str
    metadata_path: str


class CheckpointStorage:
    """Checkpoint and state files under one root URI (local path, file://, memory://, s3://...).

    Every path it returns is a full URI when the root was given as one, else a local path.
    """

    def __init__(self, root_uri: str, storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(root_uri, str) or not root_uri.strip():
            raise ConfigurationError(
                f"checkpoint storage root {root_uri!r} is empty: give a local path or an "
                "fsspec URI such as s3://bucket/checkpoints"
            )
        try:
            fs, root = url_to_fs(root_uri, **dict(storage_options or {}))
        except (ValueError, ImportError, TypeError, OSError) as exc:
            raise ConfigurationError(f"cannot open checkpoint storage {root_uri!r}: {exc}") from exc
        self.root_uri = root_uri
        self.fs: AbstractFileSystem = fs
        self._root = root.rstrip("/")
        self._uri_paths = "://" in root_uri

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.root_uri!r})"

    # -- paths ------------------------------------------------------------------------------

    @property
    def root(self) -> str:
        """The storage root as users wrote it (a URI when they gave one)."""
        return self._public(self._root or "/")

    def _public(self, fs_path: str) -> str:
        return self.fs.unstrip_protocol(fs_path) if self._uri_paths else fs_path

    def _under_root(self, *parts: str) -> str:
        """Join validated parts under the root and re-check confinement (defence in depth)."""
        path = "/".join([self._root, *parts])
        if posixpath.normpath(path) != path or not path.startswith(self._root + "/"):
            raise UnsafePathError(f"path {path!r} would leave checkpoint storage {self.root}")
        return path

    def _pipeline_fs_dir(self, pipeline_key: str) -> str:
        return self._under_root(validate_pipeline_key(pipeline_key))

    def _checkpoint_fs_dir(self, pipeline_key: str, checkpoint_id: int) -> str:
        return self._under_root(
            validate_pipeline_key(pipeline_key), checkpoint_dir_name(checkpoint_id)
        )

    def pipeline_dir(self, pipeline_key: str) -> str:
        """The pipeline's directory: its checkpoints, state files and outputs."""
        return self._public(self._pipeline_fs_dir(pipeline_key))

    def checkpoint_dir(self, pipeline_key: str, checkpoint_id: int) -> str:
        """The ``chk-<id>`` directory of a checkpoint."""
        return self._public(self._checkpoint_fs_dir(pipeline_key, checkpoint_id))

    def metadata_path(self, pipeline_key: str, checkpoint_id: int) -> str:
        """Where a checkpoint's ``_metadata`` is (whether or not it exists)."""
        fs_dir = self._checkpoint_fs_dir(pipeline_key, checkpoint_id)
        return self._public(f"{fs_dir}/{METADATA_FILE_NAME}")

    def _to_fs_path(self, path: str) -> str:
        """A user path (URI, filesystem path, or path relative to the root) as a fs path."""
        if not isinstance(path, str) or not path:
            raise UnsafePathError(f"invalid checkpoint path {path!r}: it is empty")
        if "\x00" in path:
            raise UnsafePathError(f"invalid checkpoint path {path!r}: it contains NUL")
        if "://" in path:
            protocol = path.split("://", 1)[0]
            if protocol not in protocols_of(self.fs):
                raise UnsafePathError(
                    f"checkpoint path {path!r} is on filesystem {protocol!r}, but checkpoint "
                    f"storage {self.root} is on {protocols_of(self.fs)[0]!r}"
                )
            return str(self.fs._strip_protocol(path)).rstrip("/")
        if self._root and (path == self._root or path.startswith(self._root + "/")):
            return path.rstrip("/")
        if path.startswith("/"):
            return path.rstrip("/")
        return f"{self._root}/{path.rstrip('/')}"

    def locate(self, path: str) -> CheckpointLocation:
        """Parse ``<root>/<key>/chk-<id>[/_metadata]`` (URI, fs path or relative to the root)."""
        fs_path = self._to_fs_path(path)
        prefix = self._root + "/"
        if not fs_path.startswith(prefix):
            raise UnsafePathError(
                f"checkpoint path {path!r} is outside checkpoint storage {self.root}; open a "
                "CheckpointStorage on the root that holds it"
            )
        parts = fs_path[len(prefix) :].split("/")
        if parts[-1] == METADATA_FILE_NAME:
            parts = parts[:-1]
        checkpoint_id = parse_checkpoint_dir_name(parts[-1]) if len(parts) == 2 else None
        if checkpoint_id is None:
            raise UnsafePathError(
                f"{path!r} is not a checkpoint path: expected "
                f"{self.root}/<pipeline_key>/chk-<id>[/{METADATA_FILE_NAME}]"
            )
        key = validate_pipeline_key(parts[0])
        return CheckpointLocation(
            pipeline_key=key,
            checkpoint_id=checkpoint_id,
            checkpoint_dir=self.checkpoint_dir(key, checkpoint_id),
            metadata_path=self.metadata_path(key, checkpoint_id),
        )

    def resolve_handle(self, pipeline_key: str, handle: StateHandle | str) -> str:
        """The full path of a state handle; refuses handle paths that escape the pipeline dir."""
        relpath = handle.path if isinstance(handle, StateHandle) else handle
        return self._public(self._state_fs_path(pipeline_key, relpath))

    def _state_fs_path(self, pipeline_key: str, relpath: str) -> str:
        return self._under_root(validate_pipeline_key(pipeline_key), *validate_state_path(relpath))

    # -- checkpoints ------------------------------------------------------------------------

    def _read_bytes(
        self,
        fs_path: str,
        limit: int = MAX_DOCUMENT_BYTES,
        what: str = "file",
        error: type[FinalCheckpointError] = StorageError,
    ) -> bytes | None:
        """The file's bytes, or None if it does not exist; a file over ``limit`` bytes is
        refused unread (``error``, see ``storage.bounded``), other I/O errors as StorageError.
        """
        try:
            savepoint_files.refuse_link_out(self.fs, fs_path, self._root or "/")
            return read_capped(self.fs, fs_path, limit, what=what, error=error)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {self._public(fs_path)}: {exc}") from exc

    def _read_metadata(self, fs_path: str) -> bytes | None:
        """A ``_metadata`` file's bytes (None if absent); over MAX_METADATA_BYTES: MetadataError,
        so a reader falls back as from any corrupt checkpoint.
        """
        return self._read_bytes(fs_path, MAX_METADATA_BYTES, "checkpoint metadata", MetadataError)

    def _existing_metadata(self, fs_path: str, size: int) -> bytes | None:
        """What a ``_metadata`` about to be written holds already, read up to ``size`` bytes
        (the new file's): a larger file differs, whatever it holds (None: there is none).
        """
        try:
            return self._read_bytes(fs_path, size, "checkpoint metadata", _LargerFileError)
        except _LargerFileError:
            return b""  # never the bytes of a metadata file

    def write_checkpoint(
        self, record: CheckpointRecord, *, replace_orphan: bool = False
    ) -> tuple[str, int]:
        """Atomically and durably write ``_metadata``: the checkpoint is complete once it exists.

        Rewriting identical bytes is a no-op (a retried write). Different bytes for an existing
        checkpoint are refused, because checkpoint ids are never reused, unless
        ``replace_orphan``: the caller (the coordinator, completing this id under the pipeline
        lock) knows the id was never completed, so whatever its directory holds was left by a
        completion that failed or was rolled back (a complete-looking ``_metadata``, a temporary
        file, an empty directory): the directory is cleared and written afresh.
        """
        fs_dir = self._checkpoint_fs_dir(record.pipeline_key, record.checkpoint_id)
        fs_path = f"{fs_dir}/{METADATA_FILE_NAME}"
        data = dump_metadata(record)
        existing = self._existing_metadata(fs_path, len(data))
        if existing == data:
            return self._public(fs_path), len(data)
        if existing is not None and not replace_orphan:
            raise StorageError(
                f"checkpoint {record.checkpoint_id} of pipeline {record.pipeline_key!r} already "
                f"has different metadata at {self._public(fs_path)}; checkpoint ids are never "
                "reused"
            )
        try:
            if replace_orphan and self.fs.exists(fs_dir):
                self.fs.rm(fs_dir, recursive=True)
            if savepoint_files.is_self_contained_kind(record):
                # before _metadata: a complete savepoint always holds what it references
                savepoint_files.bundle(self, record, fs_dir)
            atomic_write(self.fs, fs_path, data)
        except OSError as exc:
            raise StorageError(
                f"cannot write checkpoint metadata {self._public(fs_path)}: {exc}"
            ) from exc
        return self._public(fs_path), len(data)

    def read_checkpoint(self, path: str) -> CheckpointRecord:
        """Load a checkpoint given its directory, its ``_metadata`` path or a full URI."""
        record, _version = self.read_checkpoint_versioned(path)
        return record

    def read_checkpoint_versioned(self, path: str) -> tuple[CheckpointRecord, int]:
        """As :meth:`read_checkpoint`, with the metadata format version the file was written in
        (version 1 files are read through the upgrade to the current version).
        """
        location = self.locate(path)
        fs_dir = self._checkpoint_fs_dir(location.pipeline_key, location.checkpoint_id)
        data = self._read_metadata(f"{fs_dir}/{METADATA_FILE_NAME}")
        if data is None:
            raise MetadataError(
                f"no checkpoint metadata at {location.metadata_path}: the checkpoint does not "
                "exist or never completed"
            )
        return load_metadata_versioned(data, source=location.metadata_path)

    def materialize(self, record: CheckpointRecord, source: str) -> int:
        """Restoring from the savepoint at ``source``: copy the files it holds (see
        :mod:`~airflow_finalckpt.storage.savepoint_files`) that the pipeline directory lacks
        into it, verified; returns how many. Idempotent; a checkpoint without a file list
        copies nothing.
        """
        return savepoint_files.materialize(self, record, source)

    def discard_checkpoint(self, metadata_path: str) -> None:
        """Delete a checkpoint directory; idempotent.

        ``_metadata`` goes first, so a crash half-way leaves an incomplete checkpoint (ignored)
        rather than a complete-looking one with missing files.
        """
        location = self.locate(metadata_path)
        fs_dir = self._checkpoint_fs_dir(location.pipeline_key, location.checkpoint_id)
        try:
            if self.fs.exists(f"{fs_dir}/{METADATA_FILE_NAME}"):
                self.fs.rm_file(f"{fs_dir}/{METADATA_FILE_NAME}")
            if self.fs.exists(fs_dir):
                self.fs.rm(fs_dir, recursive=True)
        except FileNotFoundError:
            pass  # discarded concurrently: the goal is reached
        except OSError as exc:
            raise StorageError(
                f"cannot discard checkpoint {location.checkpoint_dir}: {exc}"
            ) from exc

    def discard_checkpoint_dir(self, pipeline_key: str, checkpoint_id: int) -> None:
        """Delete ``chk-<id>`` of a pipeline, complete or not (as ``discard_checkpoint``)."""
        self.discard_checkpoint(self.metadata_path(pipeline_key, checkpoint_id))

    def checkpoint_dir_ids(self, pipeline_key: str) -> list[int]:
        """Ids of every ``chk-<id>`` directory of a pipeline, with or without ``_metadata``
        (one listing of the pipeline directory), ascending.
        """
        return sorted(self._list_checkpoint_dirs(pipeline_key)[1])

    def list_checkpoints(self, pipeline_key: str) -> list[tuple[int, str]]:
        """Completed checkpoints (those with ``_metadata``) as (id, metadata path), by id."""
        fs_dir, ids = self._list_checkpoint_dirs(pipeline_key)
        found = []
        for checkpoint_id in sorted(ids):
            fs_path = f"{fs_dir}/{checkpoint_dir_name(checkpoint_id)}/{METADATA_FILE_NAME}"
            if self.fs.isfile(fs_path):
                found.append((checkpoint_id, self._public(fs_path)))
        return found

    def _list_checkpoint_dirs(self, pipeline_key: str) -> tuple[str, list[int]]:
        """The pipeline's directory (fsspec path) and the ids of its ``chk-<id>`` entries, from a
        fresh listing (fsspec caches listings; another process may have written since).
        """
        fs_dir = self._pipeline_fs_dir(pipeline_key)
        self.fs.invalidate_cache(fs_dir)
        try:
            entries = self.fs.ls(fs_dir, detail=False)
        except FileNotFoundError:
            return fs_dir, []
        except OSError as exc:
            raise StorageError(f"cannot list {self._public(fs_dir)}: {exc}") from exc
        ids = (parse_checkpoint_dir_name(posixpath.basename(str(e).rstrip("/"))) for e in entries)
        return fs_dir, [i for i in ids if i is not None]

    # -- hints ------------------------------------------------------------------------------

    def _hint_fs_path(self, scope: str, name: str) -> str:
        return self._under_root(HINTS_DIR, validate_pipeline_key(scope), f"{name}.json")

    def read_hint(self, scope: str, name: str) -> bytes | None:
        """A small advisory file shared by the runs of one scope (e.g. a DAG); None if absent."""
        return self._read_bytes(self._hint_fs_path(scope, validate_pipeline_key(name)))

    def write_hint(self, scope: str, name: str, data: bytes) -> None:
        """Atomically replace an advisory file (e.g. a stage's measured batch throughput)."""
        fs_path = self._hint_fs_path(scope, validate_pipeline_key(name))
        try:
            atomic_write(self.fs, fs_path, bytes(data))
        except OSError as exc:
            raise StorageError(f"cannot write {self._public(fs_path)}: {exc}") from exc

    # -- state files ------------------------------------------------------------------------

    def write_state(
        self, pipeline_key: str, relpath: str, data: bytes, *, name: str | None = None
    ) -> StateHandle:
        """Atomically write a state file under the pipeline dir; the handle carries its checksum."""
        fs_path = self._state_fs_path(pipeline_key, relpath)
        payload = bytes(data)
        try:
            atomic_write(self.fs, fs_path, payload)
        except OSError as exc:
            raise StorageError(f"cannot write state file {self._public(fs_path)}: {exc}") from exc
        return StateHandle(
            name=name if name is not None else posixpath.basename(relpath),
            path=relpath,
            size=len(payload),
            sha256=hashlib.sha256(payload).hexdigest(),
        )

    def read_file(self, pipeline_key: str, relpath: str) -> bytes | None:
        """A file under the pipeline dir, unverified (no handle); None if it does not exist."""
        return self._read_bytes(self._state_fs_path(pipeline_key, relpath))

    def read_state(self, pipeline_key: str, handle: StateHandle) -> bytes:
        """The state file's bytes, verified against the handle's size and sha256."""
        fs_path = self._state_fs_path(pipeline_key, handle.path)
        where = f"state file {self._public(fs_path)} (handle {handle.name!r})"
        data = self._read_bytes(fs_path, max(handle.size, 0), where)  # never more than recorded
        if data is None:
            raise StorageError(f"{where} is missing")
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != handle.size or digest != handle.sha256:
            raise StorageError(
                f"{where} is corrupt: expected {handle.size} bytes with sha256 {handle.sha256}, "
                f"found {len(data)} bytes with sha256 {digest}"
            )
        return data
