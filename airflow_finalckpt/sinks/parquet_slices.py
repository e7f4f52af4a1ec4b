"""The Parquet sink's slice swap: a pipeline run's rows replace the partition directory it
owns (``replace_slice={"event_date": "{{ ds }}"}`` -> ``<table>/event_date=2013-01-05/``).

1. build: every transaction's sealed files are renamed into ``_slices/<group>/`` (hidden), then
   ``_slice.json`` (the transaction ids, the files) is written there: the group is complete;
2. swap: the complete group directory takes the partition's place: on Linux one
   ``renameat2(RENAME_EXCHANGE)`` (readers see the old partition or the new one, never none);
   elsewhere two renames (old aside, new in; between them the partition is briefly absent);
3. record: ``_slices/_txn/<txn_id>.json`` per transaction (a replay returns False), then the old
   partition and the emptied staging directories are deleted.

Every step can be replayed after a crash: files already moved are skipped, a complete group is
not rebuilt, a partition whose ``_slice.json`` names the transactions is already swapped. Data
files keep every column (readers list files recursively, as for the rest of this sink).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from airflow_finalckpt.sinks.base import NotPrecommittedError, SinkError
from airflow_finalckpt.sinks.parquet_files import MANIFEST_FORMAT, TableFiles, fsync

SLICES_DIR = "_slices"
RECORDS_DIR = "_txn"
SLICE_MANIFEST = "_slice.json"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def slice_dir(replace_slice: Mapping[str, Any]) -> str:
    """``col=value[/col2=value2]``: the partition directory of a slice (Hive's naming)."""
    parts = []
    for column, value in replace_slice.items():
        text = str(value)
        if not text or "/" in text or text.startswith((".", "_")) or "\x00" in text:
            raise SinkError(f"slice value {text!r} of {column!r} cannot name a directory")
        parts.append(f"{column}={text}")
    return "/".join(parts)


def _exchange(a: str, b: str) -> bool:
    """Swap two directories atomically (Linux renameat2); False where it is not available."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name, use_errno=True)
    call = getattr(libc, "renameat2", None)
    if call is None:
        return False
    done = call(_AT_FDCWD, a.encode(), _AT_FDCWD, b.encode(), _RENAME_EXCHANGE)
    return bool(done == 0)


class SliceSwap:
    """The swap of one sink's slice partition on a local (or rename-atomic) filesystem."""

    def __init__(self, files: TableFiles, root: str, sink_id: str) -> None:
        self.files = files
        self.fs = files.fs
        self.root = root
        self.sink_id = sink_id

    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def record_path(self, txn_id: str) -> str:
        """The commit record of a transaction published by a slice swap."""
        return self._path(SLICES_DIR, RECORDS_DIR, f"{txn_id}.json")

    def recorded_txn_ids(self) -> set[str]:
        """Every transaction a slice swap of this table published."""
        names = self.files.list_names(self._path(SLICES_DIR, RECORDS_DIR))
        return {n[: -len(".json")] for n in names if n.endswith(".json")}

    def commit(
        self,
        txn_ids: Sequence[str],
        staging: Mapping[str, str],
        replace_slice: Mapping[str, Any],
    ) -> bool:
        """Replace the slice's partition with the transactions' files; False on a replay.
        ``staging``: transaction id -> its sealed staging directory.
        """
        live = self._path(slice_dir(replace_slice))
        if all(self.files.exists(self.record_path(t)) for t in txn_ids):
            return False
        group = "g-" + hashlib.sha1(",".join(sorted(txn_ids)).encode()).hexdigest()[:16]
        building = self._path(SLICES_DIR, group)
        retired = self._path(SLICES_DIR, f"{group}.replaced")
        if set(txn_ids) & set(self._slice_doc(live).get("txn_ids", [])):
            # swapped before a crash: the group directory, if any, holds the old partition
            self._finish(txn_ids, staging, live, [building, retired])
            return False
        if not self.files.exists(f"{building}/{SLICE_MANIFEST}"):
            self._build(building, txn_ids, staging, replace_slice)
        self._swap(building, live, retired)
        self._finish(txn_ids, staging, live, [building, retired])
        return True

    def _slice_doc(self, directory: str) -> dict[str, Any]:
        path = f"{directory}/{SLICE_MANIFEST}"
        return self.files.read_manifest(path) if self.files.exists(path) else {}

    def _build(
        self,
        building: str,
        txn_ids: Sequence[str],
        staging: Mapping[str, str],
        replace_slice: Mapping[str, Any],
    ) -> None:
        self.fs.makedirs(building, exist_ok=True)
        files: list[dict[str, Any]] = []
        for index, txn_id in enumerate(txn_ids):
            manifest_path = f"{staging[txn_id]}/_manifest.json"
            if not self.files.exists(manifest_path):
                raise NotPrecommittedError(
                    f"sink {self.sink_id!r}: transaction {txn_id!r} has no pre-committed data "
                    "to replace the slice with: never pre-committed or aborted"
                )
            manifest = self.files.read_manifest(manifest_path)
            for entry in manifest["files"]:
                name = f"{index:05d}-{entry['path'].replace('/', '-')}"
                source, target = f"{staging[txn_id]}/{entry['path']}", f"{building}/{name}"
                if not self.files.exists(target):
                    self.fs.mv(source, target)
                files.append({"path": name, "size": entry["size"], "rows": entry["rows"]})
        if self.files.local:
            fsync(building, directory=True)
        document = {
            "format": MANIFEST_FORMAT,
            "sink_id": self.sink_id,
            "txn_ids": list(txn_ids),
            "slice": dict(replace_slice),
            "files": files,
            "rows": sum(int(f["rows"]) for f in files),
            "built_at": time.time(),
        }
        self.files.write_atomically(
            f"{building}/{SLICE_MANIFEST}", json.dumps(document, sort_keys=True).encode()
        )

    def _swap(self, building: str, live: str, retired: str) -> None:
        """The complete group takes the live partition's place; the old one ends in
        ``building`` (exchanged) or ``retired`` (moved aside).
        """
        parent = live.rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        if self.files.exists(live):
            if self.files.local and _exchange(building, live):
                fsync(parent, directory=True)
                return
            self.fs.mv(live, retired, recursive=True)
        if self.files.local:
            os.rename(building, live)
            fsync(parent, directory=True)
        else:
            self.fs.mv(building, live, recursive=True)

    def _finish(
        self,
        txn_ids: Sequence[str],
        staging: Mapping[str, str],
        live: str,
        leftovers: Sequence[str],
    ) -> None:
        """Record each transaction, then delete the old partition and the staging leftovers."""
        doc = json.dumps({"format": MANIFEST_FORMAT, "slice_dir": live}).encode()
        for txn_id in txn_ids:
            self.fs.makedirs(self._path(SLICES_DIR, RECORDS_DIR), exist_ok=True)
            self.files.create_exclusively(self.record_path(txn_id), doc)
        for leftover in [*leftovers, *(staging[t] for t in txn_ids)]:
            if self.files.exists(leftover):
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(leftover, recursive=True)

    def committed_files(self, depth: int) -> Iterator[str]:
        """Relative paths of the data files of every live slice partition (``depth``: the
        number of slice columns), from their ``_slice.json``.
        """
        self.fs.invalidate_cache(self.root)
        if not self.fs.exists(self.root):
            return
        for path in sorted(self.fs.find(self.root, maxdepth=depth + 1, detail=False)):
            relative = self.fs._strip_protocol(path)[len(self.root) + 1 :]
            parts = relative.split("/")
            if parts[-1] != SLICE_MANIFEST or any(p.startswith(("_", ".")) for p in parts[:-1]):
                continue
            directory = "/".join(parts[:-1])
            for entry in self.files.read_manifest(self._path(relative))["files"]:
                yield f"{directory}/{entry['path']}"
