"""Iceberg and Delta tables as incremental sources (pyiceberg, deltalake, no Spark): the files
appended after the cursor's snapshot/version, compaction passed over, rows changed in place
refused with the snapshot/version named.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_finalckpt.core.errors import SourceRefusedError
from airflow_finalckpt.core.source_cursor import advance, new_cursor, plan_range
from airflow_finalckpt.sources import DeltaAppends, IcebergAppends
from tests.extras import import_extra

import_extra("pyiceberg", "lakehouse")
import_extra("deltalake", "lakehouse")


def rows(first: int, count: int) -> pa.Table:
    ids = list(range(first, first + count))
    return pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array(ids, pa.int64())})


def _iceberg(tmp_path: Path):  # type: ignore[no-untyped-def]
    from pyiceberg.catalog import load_catalog

    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    catalog = load_catalog(
        "finalckpt", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=str(warehouse)
    )
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.events", schema=rows(0, 1).schema)
    return table, IcebergAppends("ns.events", warehouse=str(warehouse))


def test_iceberg_reads_the_appends_after_the_cursor(tmp_path: Path) -> None:
    table, source = _iceberg(tmp_path)
    cursor = new_cursor("c", source.kind)
    empty = plan_range(cursor, source.list_new(cursor))
    assert empty.files == () and empty.end is None
    table.append(rows(0, 3))
    table.append(rows(3, 2))
    first = plan_range(cursor, source.list_new(cursor))
    assert len(first.files) == 2 and first.end == table.current_snapshot().snapshot_id
    cursor = advance(cursor, first, first.splits)
    table.append(rows(5, 1))
    second = plan_range(cursor, source.list_new(cursor))
    assert len(second.files) == 1 and not set(second.splits) & set(first.splits)
    import pyarrow.parquet as pq

    read = pa.concat_tables(
        [pq.read_table(s.removeprefix("file://")) for s in first.splits + second.splits]
    )
    assert sorted(read.column("id").to_pylist()) == list(range(6))


def test_iceberg_refuses_a_delete_in_the_range(tmp_path: Path) -> None:
    table, source = _iceberg(tmp_path)
    table.append(rows(0, 3))
    cursor = new_cursor("c", source.kind)
    cursor = advance(cursor, plan_range(cursor, source.list_new(cursor)), [])
    table.delete("id == 1")
    with pytest.raises(SourceRefusedError, match=r"snapshot \d+ \((overwrite|delete)\)"):
        source.list_new(cursor)


def test_iceberg_refuses_a_cursor_snapshot_not_in_the_history(tmp_path: Path) -> None:
    table, source = _iceberg(tmp_path)
    table.append(rows(0, 1))
    with pytest.raises(SourceRefusedError, match="not an ancestor"):
        source.list_new(new_cursor("c", source.kind, position=12345))


def test_delta_reads_the_versions_after_the_cursor(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    uri = str(tmp_path / "delta")
    source = DeltaAppends(uri)
    cursor = new_cursor("c", source.kind)
    assert source.list_new(cursor).files == ()  # no table yet
    write_deltalake(uri, rows(0, 3))
    write_deltalake(uri, rows(3, 2), mode="append")
    first = plan_range(cursor, source.list_new(cursor))
    assert (len(first.files), first.end) == (2, 1)
    cursor = advance(cursor, first, first.splits)
    DeltaTable(uri).optimize.compact()  # compaction: same rows, passed over
    write_deltalake(uri, rows(5, 1), mode="append")
    second = plan_range(cursor, source.list_new(cursor))
    assert len(second.files) == 1 and second.end == DeltaTable(uri).version()
    import pyarrow.parquet as pq

    read = pa.concat_tables(
        [pq.read_table(s.removeprefix("file://")) for s in first.splits + second.splits]
    )
    assert sorted(read.column("id").to_pylist()) == list(range(6))
    cursor = advance(cursor, second, second.splits)
    DeltaTable(uri).delete("id = 1")
    with pytest.raises(SourceRefusedError, match=r"version \d+ removes rows"):
        source.list_new(cursor)


class _Summary:
    def __init__(self, operation: str) -> None:
        self.operation = operation


class _Snapshot:
    def __init__(self, snapshot_id: int, parent: int | None, operation: str) -> None:
        self.snapshot_id, self.parent_snapshot_id = snapshot_id, parent
        self.summary = _Summary(operation)


class _History:
    """A table history pyiceberg 0.12 cannot write: a compaction (``replace``) snapshot."""

    def __init__(self, *operations: str) -> None:
        self.snapshots = {i + 1: _Snapshot(i + 1, i or None, op) for i, op in enumerate(operations)}

    def current_snapshot(self) -> _Snapshot:
        return self.snapshots[max(self.snapshots)]

    def snapshot_by_id(self, snapshot_id: int) -> _Snapshot:
        return self.snapshots[snapshot_id]


def test_iceberg_passes_over_a_compaction_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_finalckpt.core.source_cursor import SourceFile
    from airflow_finalckpt.sources import iceberg

    history = _History("append", "append", "replace", "append")
    source = IcebergAppends("ns.t", warehouse="/unused")
    monkeypatch.setattr(source, "load", lambda: history)
    monkeypatch.setattr(
        iceberg,
        "_added_files",
        lambda _table, snapshot: [
            SourceFile(f"f{snapshot.snapshot_id}", f"f{snapshot.snapshot_id}")
        ],
    )
    cursor = new_cursor("c", source.kind, position=1)
    rng = plan_range(cursor, source.list_new(cursor))
    # the replace snapshot (3) rewrote rows already read or in this range: passed over
    assert rng.splits == ["f2", "f4"] and (rng.start, rng.end) == (1, 4)
    history.snapshots[5] = _Snapshot(5, 4, "overwrite")
    with pytest.raises(SourceRefusedError, match=r"snapshot 5 \(overwrite\)"):
        source.list_new(advance(cursor, rng, rng.splits))


def test_delta_change_data_feed_passes_deletes_over_and_refuses_updates(tmp_path: Path) -> None:
    """With the feed: a delete (rewriting the survivors into a new file, or removing a whole
    file) and a compaction add no rows; an update in the range is refused, naming it."""
    from deltalake import DeltaTable, write_deltalake

    from airflow_finalckpt.sources.delta import CDF_PROPERTY

    uri = str(tmp_path / "delta")
    write_deltalake(uri, rows(0, 3), configuration={CDF_PROPERTY: "true"})  # v0
    write_deltalake(uri, rows(3, 3), mode="append")  # v1
    source = DeltaAppends(uri)
    cursor = new_cursor("c", source.kind)
    first = plan_range(cursor, source.list_new(cursor))
    assert sorted(_ids(first.splits)) == list(range(6))
    cursor = advance(cursor, first, first.splits)
    DeltaTable(uri).delete("id = 1")  # v2: 0 and 2 rewritten into a new file
    DeltaTable(uri).delete("id >= 3")  # v3: a whole file removed
    write_deltalake(uri, rows(6, 2), mode="append")  # v4
    assert DeltaTable(uri).optimize.compact()["numFilesRemoved"] == 2  # v5
    DeltaTable(uri).delete("id = 6")  # v6: in the same range as the append of 6
    second = plan_range(cursor, source.list_new(cursor))
    assert second.end == 6 == DeltaTable(uri).version()
    assert sorted(_ids(second.splits)) == [6, 7]  # 6 was appended, then deleted: read once
    cursor = advance(cursor, second, second.splits)
    DeltaTable(uri).update(updates={"value": "0"}, predicate="id = 7")  # v7
    with pytest.raises(
        SourceRefusedError,
        match=r"version 7 changes rows already published \(update_postimage, update_preimage",
    ):
        source.list_new(cursor)


def test_delta_change_data_feed_refuses_an_overwrite(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    from airflow_finalckpt.sources.delta import CDF_PROPERTY

    uri = str(tmp_path / "delta")
    write_deltalake(uri, rows(0, 3), configuration={CDF_PROPERTY: "true"})
    source = DeltaAppends(uri)
    first = plan_range(new_cursor("c", source.kind), source.list_new(new_cursor("c", "delta")))
    cursor = advance(new_cursor("c", source.kind), first, first.splits)
    write_deltalake(uri, rows(1, 3), mode="overwrite")  # 1 and 2 survive: not new rows
    with pytest.raises(
        SourceRefusedError, match=r"version 1 changes rows already published \(delete, insert"
    ):
        source.list_new(cursor)


def test_delta_without_the_feed_refuses_a_delete_and_names_the_way(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    uri = str(tmp_path / "delta")
    write_deltalake(uri, rows(0, 3))
    DeltaTable(uri).delete("id = 1")
    with pytest.raises(SourceRefusedError, match=r"delta.enableChangeDataFeed=true on the table"):
        DeltaAppends(uri).list_new(new_cursor("c", "delta"))


def _ids(splits: list[str]) -> list[int]:
    import pyarrow.parquet as pq

    tables = [pq.read_table(s.removeprefix("file://")) for s in splits]
    return pa.concat_tables(tables).column("id").to_pylist() if tables else []
