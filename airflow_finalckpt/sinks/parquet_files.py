"""The file operations the Parquet sink's commit protocol rests on, on any fsspec filesystem.

Each is safe against a crash and a racing process: a file is written whole under a hidden
temporary name then renamed (one PUT on object stores), created only if absent, copied only where
the target is missing or torn, and fsynced with its directories on local disks. Listings are
always asked afresh, since the caches of s3fs and gcsfs could hide another process's commit.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from airflow_finalckpt.sinks.base import SinkError
from airflow_finalckpt.storage.bounded import MAX_DOCUMENT_BYTES, read_capped

MANIFEST_FORMAT = 1


def is_hidden(relative_path: str) -> bool:
    """Spark and pyarrow skip any path segment starting with ``_`` or ``.``; so do we."""
    return any(part.startswith(("_", ".")) for part in relative_path.split("/"))


def fsync(path: str, *, directory: bool = False) -> None:
    """Flush a local file, or a directory's entries, to stable storage."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary_name(path: str) -> tuple[str, str]:
    """(directory, hidden temporary path beside ``path``): readers skip it, a crash leaves it
    recognisable as a temporary file.
    """
    directory, name = path.rsplit("/", 1)
    return directory, f"{directory}/_tmp-{uuid.uuid4().hex}-{name}"


def _write_local(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


class TableFiles:
    """The filesystem of one sink's table; ``sink_id`` names the sink in error messages."""

    def __init__(self, fs: fsspec.AbstractFileSystem, sink_id: str) -> None:
        self.fs = fs
        self.sink_id = sink_id
        self.local = isinstance(fs, LocalFileSystem)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists now (never from a listing cache)."""
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    def list_names(self, path: str) -> list[str]:
        """The entry names of directory ``path``; none if it does not exist."""
        self.fs.invalidate_cache(path)
        if not self.fs.exists(path):
            return []
        return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(path, False)]

    def write_atomically(self, path: str, data: bytes) -> None:
        """Readers see the old content or the new one, never a torn file."""
        if not self.local:
            self.fs.pipe_file(path, data)  # one object PUT: atomic on object stores
            return
        directory, temporary = _temporary_name(path)
        _write_local(temporary, data)
        os.replace(temporary, path)
        fsync(directory, directory=True)

    def create_exclusively(self, path: str, data: bytes) -> bool:
        """Create ``path`` complete and only if absent; False if it already existed."""
        if self.local:
            return self._create_local_exclusively(path, data)
        if self.exists(path):
            return False
        try:
            with self.fs.open(path, "xb") as handle:  # conditional PUT where supported
                handle.write(data)
        except FileExistsError:
            return False
        except (NotImplementedError, ValueError, TypeError):
            self.fs.pipe_file(path, data)  # backend without exclusive create
        return True

    @staticmethod
    def _create_local_exclusively(path: str, data: bytes) -> bool:
        directory, temporary = _temporary_name(path)
        os.makedirs(directory, exist_ok=True)
        _write_local(temporary, data)
        try:
            os.link(temporary, path)  # fails if path exists: exclusive and atomic
        except FileExistsError:
            return False
        finally:
            os.unlink(temporary)
        fsync(directory, directory=True)
        return True

    def read_manifest(self, path: str) -> dict[str, Any]:
        """A manifest or commit record, refused unless it is JSON of the expected format."""
        try:
            what = f"sink {self.sink_id!r}: manifest"
            raw = read_capped(self.fs, path, MAX_DOCUMENT_BYTES, what=what, error=SinkError)
            document = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SinkError(f"sink {self.sink_id!r}: {path} is not valid JSON: {exc}") from exc
        if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
            raise SinkError(
                f"sink {self.sink_id!r}: {path} is not a format-{MANIFEST_FORMAT} manifest"
            )
        return document

    def data_files(self, directory: str) -> dict[str, int]:
        """Visible files under ``directory`` (relative path -> size), skipping hidden ones such
        as Spark's ``_SUCCESS``, ``_temporary/`` and ``.crc`` files and our temporary files.
        """
        self.fs.invalidate_cache(directory)
        found = self.fs.find(directory, detail=True)
        prefix = directory.rstrip("/") + "/"
        files: dict[str, int] = {}
        for path, info in found.items():
            stripped = self.fs._strip_protocol(path)
            if not stripped.startswith(prefix):
                continue
            relative = stripped[len(prefix) :]
            if not is_hidden(relative):
                files[relative] = int(info.get("size") or 0)
        return dict(sorted(files.items()))

    def row_count(self, path: str) -> int:
        """The rows of a Parquet file, from its footer; a clear error if it is not one."""
        import pyarrow.parquet as pq

        try:
            with self.fs.open(path, "rb") as handle:
                return int(pq.ParquetFile(handle).metadata.num_rows)
        except Exception as exc:  # pyarrow raises ArrowInvalid and friends
            raise SinkError(
                f"sink {self.sink_id!r}: staged file {path} is not a readable Parquet file: {exc}"
            ) from exc

    def fsync_tree(self, top: str, relative_files: list[str], *directories: str) -> None:
        """Flush the files under ``top``, every directory on their way, and ``directories``."""
        todo = {top, *directories}
        for relative in relative_files:
            fsync(f"{top}/{relative}")
            parts = relative.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                todo.add("/".join((top, *parts[:depth])))
        for directory in todo:
            fsync(directory, directory=True)

    def copy_files(self, sources: list[str], targets: list[str]) -> None:
        """Copy (server side on object stores) every source whose target is missing or differs
        in size (a half-written copy of a crashed commit); fsync them on local disks.
        """
        todo = [(s, t) for s, t in zip(sources, targets, strict=True) if not self._same_size(s, t)]
        if todo:
            for directory in sorted({target.rsplit("/", 1)[0] for _, target in todo}):
                self.fs.makedirs(directory, exist_ok=True)
            if self.local:
                for source, target in todo:
                    # Through a hidden temporary name: a racing copier never truncates a file
                    # another committer already published.
                    _, temporary = _temporary_name(target)
                    shutil.copyfile(source, temporary)
                    os.replace(temporary, target)
            else:
                self.fs.copy([s for s, _ in todo], [t for _, t in todo])
        if self.local:
            for target in targets:
                fsync(target)
            for directory in {target.rsplit("/", 1)[0] for target in targets}:
                fsync(directory, directory=True)

    def _same_size(self, source: str, target: str) -> bool:
        self.fs.invalidate_cache(target)
        try:
            return int(self.fs.size(target)) == int(self.fs.size(source))
        except FileNotFoundError:
            return False
