"""What the lakehouse sink tests share: the sinks under test and the table-side views that check
them (snapshots / versions, referenced files, staged files, rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink
from airflow_finalckpt.sinks.staged import STAGING_DIR, StagedTableSink

KINDS = ["iceberg", "delta"]


def make_sink(
    kind: str, root: Path | str, sink_id: str = "orders", **options: Any
) -> StagedTableSink:
    """The table ``orders`` under ``root``: Iceberg in a SQLite-catalog warehouse, or Delta;
    ``options`` go to the sink (``replace_slice=...``).
    """
    if kind == "iceberg":
        return IcebergTableSink(sink_id, "db.orders", warehouse=f"{root}/warehouse", **options)
    return DeltaTableSink(sink_id, f"{root}/delta/orders", **options)


def commit_count(sink: StagedTableSink) -> int:
    """Iceberg snapshots / Delta versions: one per published transaction."""
    if isinstance(sink, IcebergTableSink):
        table = sink.table()
        return 0 if table is None else len(table.snapshots())
    assert isinstance(sink, DeltaTableSink)
    delta = sink.table()
    return 0 if delta is None else delta.version() + 1


def table_files(sink: StagedTableSink) -> set[str]:
    """Data files the table's current snapshot / version references."""
    if isinstance(sink, IcebergTableSink):
        table = sink.table()
        if table is None or table.current_snapshot() is None:
            return set()
        return {task.file.file_path for task in table.scan().plan_files()}
    assert isinstance(sink, DeltaTableSink)
    delta = sink.table()
    return set() if delta is None else {str(uri) for uri in delta.file_uris()}


def staged_data_files(sink: StagedTableSink) -> set[str]:
    """Every Parquet file under the sink's staging directories, committed or not."""
    root = sink._data_root()
    if root is None:
        return set()
    base = Path(root.removeprefix("file://")) / STAGING_DIR / sink.sink_id
    return {str(path) for path in base.rglob("*.parquet")}


def read_ids(sink: StagedTableSink) -> list[int]:
    """The committed ``order_id`` values, sorted (duplicates kept)."""
    table = sink.read_arrow()
    return sorted(table.column("order_id").to_pylist()) if table.num_columns else []
