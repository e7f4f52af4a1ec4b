"""Write a file so that readers see either no file or the whole file, never a part of it.

- Local filesystem: write a temporary file in the same directory, flush and fsync it,
  ``os.replace`` it over the target (atomic on POSIX), then fsync the directory (and its parent,
  which may have just gained the directory) so the rename survives a power loss.
- Object stores (s3, gcs, azure, ...): rename is a copy plus delete there, but a single PUT is
  atomic (the object appears complete or not at all), so the bytes go up in one ``pipe_file``.
- Any other fsspec filesystem (memory, hdfs, sftp, ...): temporary file plus ``mv``, which is
  atomic wherever the filesystem's rename is.

On failure the temporary file is removed (best effort) and the error propagates; a crash that
leaves a temporary file behind is harmless: readers only look at the final name.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import uuid
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

#: Protocols whose single PUT is atomic and whose rename is not.
OBJECT_STORE_PROTOCOLS = frozenset(
    {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2", "cos", "obs", "tos"}
)
TEMP_MARKER = ".tmp-"


def protocols_of(fs: AbstractFileSystem) -> tuple[str, ...]:
    """The filesystem's protocol names (fsspec allows one string or several)."""
    protocol: Any = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def is_object_store(fs: AbstractFileSystem) -> bool:
    """Whether writes go to an object store, where a single PUT is atomic but rename is not."""
    return any(p in OBJECT_STORE_PROTOCOLS for p in protocols_of(fs))


def temporary_name(path: str) -> str:
    """A hidden sibling of ``path``: same directory, so the final rename stays within it."""
    directory, name = posixpath.split(path)
    return posixpath.join(directory, f".{name}{TEMP_MARKER}{uuid.uuid4().hex}")


def fsync_directory(path: str) -> None:
    """Persist a directory's entries (a rename is durable only after this)."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove_quietly(fs: AbstractFileSystem, path: str) -> None:
    # The temporary file may not exist; a leftover one is harmless.
    with contextlib.suppress(OSError, ValueError):
        fs.rm_file(path)


def atomic_write(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (see the module docstring for how, per fs)."""
    if is_object_store(fs):
        fs.pipe_file(path, data)
        return
    directory = posixpath.dirname(path)
    fs.makedirs(directory, exist_ok=True)
    temporary = temporary_name(path)
    local = isinstance(fs, LocalFileSystem)
    try:
        with fs.open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            if local:
                os.fsync(handle.fileno())
        if local:
            os.replace(temporary, path)
        else:
            fs.mv(temporary, path)
    except BaseException:
        _remove_quietly(fs, temporary)
        raise
    if local:
        fsync_directory(directory)
        fsync_directory(posixpath.dirname(directory))
