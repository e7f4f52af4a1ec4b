"""A Delta table read incrementally: the files added by the versions after the cursor's
version, up to the table's version when the run starts.

Each version's commit (``_delta_log/<version>.json``) is read as the Delta protocol writes it:
``add`` actions with ``dataChange`` are new rows; an OPTIMIZE (adds and removes without
``dataChange``: the same rows in other files) is passed over; a ``remove`` with ``dataChange``
(a delete, an overwrite, a merge) changes rows already published and is refused, naming the
version, as is a file with a deletion vector. A commit file cleaned up by the log retention is
refused too (the range cannot be told).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

from airflow_finalckpt.core.errors import InvalidStageArgumentError, SourceRefusedError
from airflow_finalckpt.core.source_cursor import DELTA, Cursor, Listing, SourceFile
from airflow_finalckpt.sources.base import IncrementalSource


class DeltaAppends(IncrementalSource):
    """The files appended to the Delta table at ``table_uri`` since the last committed run;
    each split id is a data file's URL (``spark.read.parquet(*ctx.splits)``).
    ``storage_options`` go to deltalake and fsspec alike.
    """

    kind = DELTA

    def __init__(
        self,
        table_uri: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cursor_id: str | None = None,
    ) -> None:
        super().__init__(cursor_id)
        if not isinstance(table_uri, str) or not table_uri:
            raise InvalidStageArgumentError(
                f"DeltaAppends: table_uri must be a path or URL, not {table_uri!r}"
            )
        self.table_uri = table_uri.rstrip("/")
        self.storage_options = dict(storage_options or {})

    def describe(self) -> str:
        """The table's URI."""
        return f"table_uri={self.table_uri!r}"

    def newest_version(self) -> int | None:
        """The table's version now (None: no table there yet)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return int(
                DeltaTable(self.table_uri, storage_options=self.storage_options or None).version()
            )
        except TableNotFoundError:
            return None

    def list_new(self, cursor: Cursor) -> Listing:
        """The files the versions after the cursor's version added, oldest version first."""
        newest = self.newest_version()
        if newest is None:
            return Listing(newest=cursor.position)
        from fsspec.core import url_to_fs

        fs, root = url_to_fs(self.table_uri, **self.storage_options)
        root = str(root).rstrip("/")
        first = 0 if cursor.position is None else cursor.position + 1
        files: list[SourceFile] = []
        for version in range(first, newest + 1):
            files.extend(self._added(fs, root, version))
        return Listing(newest=newest, files=tuple(files))

    def _added(self, fs: Any, root: str, version: int) -> list[SourceFile]:
        """The data files one version added with new rows; refuses changed rows."""
        path = f"{root}/_delta_log/{version:020d}.json"
        try:
            with fs.open(path, "rb") as handle:
                text = handle.read().decode("utf-8")
        except FileNotFoundError:
            raise SourceRefusedError(
                f"Delta table {self.table_uri!r}: the commit of version {version} is gone (log "
                "retention), so this run's range cannot be told; start a new cursor "
                "(cursor_id) to read the table whole"
            ) from None
        added: list[SourceFile] = []
        for action in _actions(text):
            remove = action.get("remove")
            if remove is not None and remove.get("dataChange", True):
                raise SourceRefusedError(
                    f"Delta table {self.table_uri!r}: version {version} removes rows already "
                    "published (a delete, overwrite or merge); an incremental source reads "
                    "appends only. Read the table whole in a new pipeline (a new cursor_id)"
                )
            add = action.get("add")
            if add is None or not add.get("dataChange", True):
                continue
            if add.get("deletionVector"):
                raise SourceRefusedError(
                    f"Delta table {self.table_uri!r}: version {version} adds a file with a "
                    "deletion vector, which a plain file read would ignore"
                )
            relative = unquote(str(add["path"]))
            location = relative if "://" in relative else f"{root}/{relative}"
            added.append(SourceFile(split_id=fs.unstrip_protocol(location), identity=relative))
        added.sort(key=lambda f: f.split_id)
        return added


def _actions(text: str) -> Iterator[dict[str, Any]]:
    """The actions of one commit file (one JSON object per line)."""
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)
