"""An Iceberg table read incrementally: the data files added by the append snapshots after
the cursor's snapshot, up to the current snapshot when the run starts.

A ``replace`` snapshot (compaction: the same rows rewritten into other files) adds nothing new
and is passed over: the rows were read, or will be, from the files the appends added (they
stay in storage until their snapshots expire: expire snapshots only behind the cursor). An
``overwrite`` or ``delete`` snapshot changes rows already published, which an append-only
reading cannot carry: the run is refused, naming the snapshot. A cursor snapshot that is no
longer an ancestor of the current one (a rollback, expired history) is refused too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_finalckpt.core.errors import InvalidStageArgumentError, SourceRefusedError
from airflow_finalckpt.core.source_cursor import ICEBERG, Cursor, Listing, SourceFile
from airflow_finalckpt.sources.base import IncrementalSource

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

#: Snapshot operations whose added data files are new rows.
APPEND_OPERATIONS = frozenset({"append"})
#: Operations that rewrite rows without changing them (compaction): passed over.
PASSED_OVER = frozenset({"replace"})


class IcebergAppends(IncrementalSource):
    """The data files appended to the Iceberg table ``table`` (``namespace.name``) since the
    last committed run. ``catalog``: pyiceberg catalog properties, or a SQLAlchemy URL of a
    SQL catalog; None: the SQLite catalog ``<warehouse>/catalog.db`` (as ``IcebergTableSink``).
    Each split id is a data file's path (``spark.read.parquet(*ctx.splits)``).
    """

    kind = ICEBERG

    def __init__(
        self,
        table: str,
        *,
        warehouse: str | None = None,
        catalog: str | Mapping[str, str] | None = None,
        catalog_name: str = "finalckpt",
        cursor_id: str | None = None,
    ) -> None:
        super().__init__(cursor_id)
        if not isinstance(table, str) or table.count(".") < 1 or not all(table.split(".")):
            raise InvalidStageArgumentError(
                f"IcebergAppends: table={table!r} must be 'namespace.name'"
            )
        if catalog is None and warehouse is None:
            raise InvalidStageArgumentError(
                "IcebergAppends needs warehouse= (its SQLite catalog) or catalog= (properties "
                "or a SQLAlchemy URL)"
            )
        self.table = table
        self.warehouse = warehouse
        self.catalog = catalog if isinstance(catalog, str | None) else dict(catalog)
        self.catalog_name = catalog_name

    def describe(self) -> str:
        """The table name."""
        return f"table={self.table!r}"

    def _properties(self) -> dict[str, str]:
        if isinstance(self.catalog, dict):
            properties = dict(self.catalog)
        else:
            uri = self.catalog
            if uri is None:
                assert self.warehouse is not None
                uri = f"sqlite:///{self.warehouse.removeprefix('file://')}/catalog.db"
            properties = {"type": "sql", "uri": uri}
        if self.warehouse is not None:
            properties.setdefault("warehouse", self.warehouse)
        return properties

    def load(self) -> Table:
        """The table, from its catalog."""
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.catalog_name, **self._properties()).load_table(self.table)

    def list_new(self, cursor: Cursor) -> Listing:
        """The files the append snapshots after the cursor's snapshot added, oldest first."""
        table = self.load()
        current = table.current_snapshot()
        if current is None:
            return Listing(newest=cursor.position)
        chain = _snapshots_after(table, current, cursor.position, self.table)
        files: list[SourceFile] = []
        for snapshot in chain:
            operation = _operation(snapshot)
            if operation in PASSED_OVER:
                continue
            if operation not in APPEND_OPERATIONS:
                raise SourceRefusedError(
                    f"Iceberg table {self.table!r}: snapshot {snapshot.snapshot_id} "
                    f"({operation}) in this run's range changes rows already published; an "
                    "incremental source reads appends only. Read the table whole in a new "
                    "pipeline (a new cursor_id), or move the cursor past it on purpose"
                )
            files.extend(_added_files(table, snapshot))
        return Listing(newest=current.snapshot_id, files=tuple(files))


def _operation(snapshot: Snapshot) -> str:
    summary = snapshot.summary
    operation = getattr(summary, "operation", None) if summary is not None else None
    return str(getattr(operation, "value", operation) or "append")


def _snapshots_after(
    table: Table, current: Snapshot, position: int | None, name: str
) -> list[Snapshot]:
    """The current snapshot's ancestors after ``position`` (exclusive), oldest first."""
    chain: list[Snapshot] = []
    snapshot: Snapshot | None = current
    while snapshot is not None and snapshot.snapshot_id != position:
        chain.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else table.snapshot_by_id(parent)
    if position is not None and snapshot is None:
        raise SourceRefusedError(
            f"Iceberg table {name!r}: the cursor's snapshot {position} is not an ancestor of the "
            f"current snapshot {current.snapshot_id} (rolled back, or its history expired); the "
            "range since the last run cannot be told. Start a new cursor (cursor_id) to read "
            "the table whole"
        )
    chain.reverse()
    return chain


def _added_files(table: Table, snapshot: Snapshot) -> list[SourceFile]:
    """The data files ``snapshot`` added (manifest entries ADDED by its own id)."""
    from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

    files: list[SourceFile] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if (
                entry.status == ManifestEntryStatus.ADDED
                and entry.snapshot_id == snapshot.snapshot_id
            ):
                path = str(entry.data_file.file_path)
                files.append(SourceFile(split_id=path, identity=path))
    files.sort(key=lambda f: f.split_id)
    return files
