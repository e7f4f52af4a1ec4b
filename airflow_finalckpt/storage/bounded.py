"""Bounded reads of user-writable storage (issue 37): whoever can write the checkpoint storage
or a sink's table directory can leave a file of any size where the plugin reads one of its own
documents. Every such read goes through :func:`read_capped`, which reads at most the file's
cap plus one byte and refuses a larger file in one line, before anything parses it.

The caps follow what the plugin writes, with room to spare:

- :data:`MAX_DOCUMENT_BYTES` (64 MiB, as a ``_metadata`` file): documents that grow with a
  stage's splits or files: a driver's ``spec.json`` (the split list) and ``result.json`` (the
  output manifest), a savepoint's file list, a sink's transaction manifests, the state
  documents a state handle names;
- :data:`MAX_SMALL_DOCUMENT_BYTES` (1 MiB): documents of a fixed shape of a few hundred bytes,
  a driver's ``heartbeat.json`` and ``current.json``;
- :data:`MAX_CODE_BYTES` (256 MiB): a stage's pickled code (``code.pkl``: its transform, hooks
  and sinks, with whatever they close over);
- a savepoint's bundled file: the size its file list records.
"""

from __future__ import annotations

import json
from typing import Any

from fsspec import AbstractFileSystem

from airflow_finalckpt.core.errors import FinalCheckpointError, StorageError

MAX_DOCUMENT_BYTES = 64 << 20
MAX_SMALL_DOCUMENT_BYTES = 1 << 20
MAX_CODE_BYTES = 256 << 20
#: The cap of each file a submitted Spark driver and its task exchange (``spark/job.py``);
#: any other: MAX_DOCUMENT_BYTES.
_DRIVER_FILE_CAPS = {
    "heartbeat.json": MAX_SMALL_DOCUMENT_BYTES,
    "current.json": MAX_SMALL_DOCUMENT_BYTES,
    "cancel": MAX_SMALL_DOCUMENT_BYTES,
    "code.pkl": MAX_CODE_BYTES,
}


def driver_file_cap(name: str) -> int:
    """How large the driver file ``name`` (``spec.json``, ``heartbeat.json``...) may be."""
    return _DRIVER_FILE_CAPS.get(name, MAX_DOCUMENT_BYTES)


def read_capped(
    fs: AbstractFileSystem,
    path: str,
    limit: int,
    *,
    what: str,
    error: type[FinalCheckpointError] = StorageError,
) -> bytes:
    """The file's bytes, reading at most ``limit + 1``; ``error`` (one line naming ``what``
    and ``path``) if it holds more than ``limit``. FileNotFoundError and other OSErrors pass
    through, for the caller to say what a missing file means.
    """
    with fs.open(path, "rb") as handle:
        data = bytes(handle.read(limit + 1))
    if len(data) > limit:
        raise error(
            f"{what} {path} is larger than the {limit} bytes it may have: refused unread "
            "(corrupt, or not written by airflow-finalckpt)"
        )
    return data


def read_json_document(fs: AbstractFileSystem, path: str, what: str) -> Any:
    """A JSON document of at most MAX_DOCUMENT_BYTES (a state handle's, a manifest):
    StorageError if larger, ValueError if it is not JSON.
    """
    return json.loads(read_capped(fs, path, MAX_DOCUMENT_BYTES, what=what))
