"""A Delta table read incrementally: the files added by the versions after the cursor's
version, up to the table's version when the run starts.

Each version's commit (``_delta_log/<version>.json``) is read as the Delta protocol writes it:
``add`` actions with ``dataChange`` are new rows; an OPTIMIZE (adds and removes without
``dataChange``: the same rows in other files) is passed over. A version that changes rows (a
``remove`` with ``dataChange``, or ``cdc`` files) is told apart by the table's change data feed
where it has one (``delta.enableChangeDataFeed=true``, read with ``load_cdf``): a version whose
changes are only ``delete`` rows (a retention purge) is passed over (the files it rewrote hold
rows read before, not new ones; published rows are not retracted); any other change (update,
merge, overwrite) is refused, naming the version, as every row-changing version is without
the feed, and a file with a deletion vector. A commit file cleaned up by the log retention is
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

#: The table property that turns a Delta table's change data feed on.
CDF_PROPERTY = "delta.enableChangeDataFeed"


class DeltaAppends(IncrementalSource):
    """The files appended to the Delta table at ``table_uri`` since the last committed run;
    each split id is a data file's URL (``spark.read.parquet(*ctx.splits)``).
    ``storage_options`` go to deltalake and fsspec alike. Where the table has a change data
    feed (``delta.enableChangeDataFeed=true``), versions that only delete rows are passed over;
    other row changes are refused (docs/sources.md).
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

    def _table(self) -> Any:
        """The table now (None: no table there yet)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.table_uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def newest_version(self) -> int | None:
        """The table's version now (None: no table there yet)."""
        table = self._table()
        return None if table is None else int(table.version())

    def list_new(self, cursor: Cursor) -> Listing:
        """The files the versions after the cursor's version added, oldest version first."""
        table = self._table()
        if table is None:
            return Listing(newest=cursor.position)
        newest = int(table.version())
        from fsspec.core import url_to_fs

        fs, root = url_to_fs(self.table_uri, **self.storage_options)
        root = str(root).rstrip("/")
        first = 0 if cursor.position is None else cursor.position + 1
        files: list[SourceFile] = []
        for version in range(first, newest + 1):
            files.extend(self._added(fs, root, table, version))
        return Listing(newest=newest, files=tuple(files))

    def _commit(self, fs: Any, root: str, version: int) -> list[dict[str, Any]]:
        path = f"{root}/_delta_log/{version:020d}.json"
        try:
            with fs.open(path, "rb") as handle:
                return list(_actions(handle.read().decode("utf-8")))
        except FileNotFoundError:
            raise SourceRefusedError(
                f"Delta table {self.table_uri!r}: the commit of version {version} is gone (log "
                "retention), so this run's range cannot be told; start a new cursor "
                "(cursor_id) to read the table whole"
            ) from None

    def _added(self, fs: Any, root: str, table: Any, version: int) -> list[SourceFile]:
        """The data files one version added with new rows; refuses changed rows."""
        actions = self._commit(fs, root, version)
        removes = any(a["remove"].get("dataChange", True) for a in actions if "remove" in a)
        if removes or any("cdc" in a for a in actions):
            changes = self._changes(table, version)
            if changes <= {"delete"}:
                return []  # deletes (a purge) or nothing changed: no new rows
            if removes or changes != {"insert"}:
                raise SourceRefusedError(
                    f"Delta table {self.table_uri!r}: version {version} "
                    f"changes rows already published ({', '.join(sorted(changes))}: an update, "
                    "merge or overwrite); an incremental source reads appended rows and passes "
                    "over deletes. Read the table whole in a new pipeline (a new cursor_id)"
                )
        added: list[SourceFile] = []
        for action in actions:
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

    def _changes(self, table: Any, version: int) -> set[str]:
        """The change types of a row-changing version, from the change data feed; refused
        where the table has none (its deletes cannot be told from overwrites).
        """
        configuration = table.metadata().configuration or {}
        if str(configuration.get(CDF_PROPERTY, "false")).lower() != "true":
            raise SourceRefusedError(
                f"Delta table {self.table_uri!r}: version {version} removes rows already "
                "published (a delete, overwrite or merge); an incremental source reads "
                "appends only. If it deletes rows (a retention purge), set "
                f"{CDF_PROPERTY}=true on the table so deletes are passed over; else read the "
                "table whole in a new pipeline (a new cursor_id)"
            )
        import pyarrow as pa

        feed = table.load_cdf(
            starting_version=version, ending_version=version, columns=["_change_type"]
        )
        return {str(c) for c in pa.table(feed).column("_change_type").to_pylist()}


def _actions(text: str) -> Iterator[dict[str, Any]]:
    """The actions of one commit file (one JSON object per line)."""
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)
