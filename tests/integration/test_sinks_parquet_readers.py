"""ParquetTableSink: committed data is plain Parquet that Spark, DuckDB and pyarrow read in place,
on a local disk (rename and copy commits) and on fsspec's memory:// filesystem (an object-store
stand-in: copy commits); interrupted copy commits, aborts and old-layout tables (data left in
``_staging`` by the former ``manifest`` mode) are handled.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import fsspec
import pandas as pd
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from pyarrow.fs import FSSpecHandler, PyFileSystem
from pyspark.sql import SparkSession

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks import AlreadyCommittedError, ParquetTableSink


def frame(*values: int) -> pd.DataFrame:
    return pd.DataFrame({"order_id": list(values), "amount": [v * 1.5 for v in values]})


def stage(sink: ParquetTableSink, txn_id: str, *values: int, ckpt: int = 1) -> SinkTransaction:
    sink.write_pandas(txn_id, frame(*values))
    return sink.precommit(txn_id, ckpt)


@pytest.fixture(params=["rename-local", "copy-local", "copy-memory"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    mode, where = request.param.split("-")
    if where == "local":
        yield str(tmp_path / "table"), mode
        return
    uri = f"memory://finalckpt-readers/{uuid.uuid4().hex}/table"
    yield uri, mode
    fs, root = fsspec.core.url_to_fs(uri)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def pyarrow_ids(uri: str) -> list[int]:
    """A plain pyarrow dataset over the table directory (hidden ``_``/``.`` paths skipped)."""
    fs, root = fsspec.core.url_to_fs(uri)
    if not fs.exists(root):
        return []
    dataset = pads.dataset(root, format="parquet", filesystem=PyFileSystem(FSSpecHandler(fs)))
    if not dataset.files:
        return []
    return sorted(dataset.to_table(columns=["order_id"])["order_id"].to_pylist())


def duckdb_ids(uri: str) -> list[int]:
    """DuckDB's ``read_parquet`` over the documented glob (memory:// through fsspec)."""
    con = duckdb.connect()
    try:
        con.register_filesystem(fsspec.filesystem("memory"))
        rows = con.sql(f"SELECT order_id FROM read_parquet('{uri}/*/*.parquet')").fetchall()
    except duckdb.IOException as exc:
        if "No files found" in str(exc):
            return []
        raise
    finally:
        con.close()
    return sorted(row[0] for row in rows)


def plain_readers(uri: str) -> dict[str, list[int]]:
    return {"pyarrow": pyarrow_ids(uri), "duckdb": duckdb_ids(uri)}


def test_plain_readers_see_exactly_the_committed_rows(table: tuple[str, str]) -> None:
    uri, mode = table
    sink = ParquetTableSink("readers", uri, commit_mode=mode)  # type: ignore[arg-type]
    first = stage(sink, "a", 1, 2)
    stage(sink, "pending", 9)  # pre-committed, its checkpoint never completes
    sink.write_pandas("open", frame(8))  # still open
    assert plain_readers(uri) == {"pyarrow": [], "duckdb": []}

    assert sink.commit(first) is True
    assert plain_readers(uri) == {"pyarrow": [1, 2], "duckdb": [1, 2]}
    second = stage(sink, "b", 3)
    assert plain_readers(uri)["duckdb"] == [1, 2]
    assert ParquetTableSink("readers", uri, commit_mode=mode).commit(second) is True  # type: ignore[arg-type]
    assert sink.commit(second) is False
    assert plain_readers(uri) == {"pyarrow": [1, 2, 3], "duckdb": [1, 2, 3]}
    assert sorted(sink.read_pandas()["order_id"]) == [1, 2, 3]
    assert sink.staged_txn_ids() == {"pending", "open"}
    # No committed row lives in a hidden folder: every committed file is under txn-<id>/.
    assert all("/txn-" in uri_ for uri_ in sink.committed_files())


def test_spark_reads_the_table_directory_in_place(spark: SparkSession, tmp_path: Path) -> None:
    for mode in ("rename", "copy"):
        uri = str(tmp_path / f"orders_{mode}")
        sink = ParquetTableSink("spark_readers", uri, commit_mode=mode)  # type: ignore[arg-type]
        df = spark.range(0, 50, numPartitions=4).withColumnRenamed("id", "order_id")
        sink.write_spark("s-b0", df)
        txn = sink.precommit("s-b0", 1)
        sink.write_spark("s-b1", spark.range(50, 60).withColumnRenamed("id", "order_id"))
        sink.precommit("s-b1", 2)  # never committed
        assert sink.commit(txn) is True
        # The directory itself, no file list; transactions are subdirectories, not ``k=v``
        # partitions, so Spark needs recursiveFileLookup (without it: UNABLE_TO_INFER_SCHEMA).
        read = spark.read.option("recursiveFileLookup", "true").parquet(uri)
        assert sorted(r.order_id for r in read.collect()) == list(range(50)), mode
        assert duckdb_ids(uri) == list(range(50)), mode
        assert pyarrow_ids(uri) == list(range(50)), mode


def test_interrupted_copy_commit_is_finished_by_the_replay(table: tuple[str, str]) -> None:
    """A crash after some files were copied: not committed yet; the replay copies the rest
    (skipping complete copies, redoing a truncated one) and publishes once."""
    uri, _mode = table
    sink = ParquetTableSink("crashy", uri, commit_mode="copy")
    sink.write_pandas("t1", frame(1, 2))
    sink.write_pandas("t1", frame(3))
    sink.write_pandas("t1", frame(4, 5))
    txn = sink.precommit("t1", 4)
    fs, root = fsspec.core.url_to_fs(uri)
    files = txn.payload["files"]
    fs.makedirs(f"{root}/txn-t1", exist_ok=True)
    fs.copy(f"{root}/_staging/t1/{files[0]}", f"{root}/txn-t1/{files[0]}")  # copied whole
    fs.pipe_file(f"{root}/txn-t1/{files[1]}", b"PAR1")  # the crash truncated this copy

    assert not sink.is_committed("t1")
    assert sink.staged_txn_ids() == {"t1"}
    restored = ParquetTableSink("crashy", uri, commit_mode="copy")
    assert restored.commit(txn) is True
    assert restored.commit(txn) is False
    assert plain_readers(uri) == {"pyarrow": [1, 2, 3, 4, 5], "duckdb": [1, 2, 3, 4, 5]}
    assert sink.staged_txn_ids() == set()
    assert not fs.exists(f"{root}/_staging/t1")


def test_crash_after_the_copy_commit_point_leaves_nothing_behind(table: tuple[str, str]) -> None:
    """Published manifest written, staging not yet deleted: committed; the replay cleans up."""
    uri, _mode = table
    sink = ParquetTableSink("cleanup", uri, commit_mode="copy")
    txn = stage(sink, "t1", 1, 2)
    fs, root = fsspec.core.url_to_fs(uri)
    staged = fs.find(f"{root}/_staging/t1")
    assert sink.commit(txn) is True
    for path in staged:  # put the staging folder back, as a crash before its deletion leaves it
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, b"left over")
    assert sink.is_committed("t1") and sink.staged_txn_ids() == set()
    assert ParquetTableSink("cleanup", uri).commit(txn) is False
    assert not fs.exists(f"{root}/_staging/t1")
    assert pyarrow_ids(uri) == [1, 2]


def test_abort_removes_files_of_an_interrupted_copy(table: tuple[str, str]) -> None:
    uri, _mode = table
    sink = ParquetTableSink("aborty", uri, commit_mode="copy")
    txn = stage(sink, "t1", 1)
    fs, root = fsspec.core.url_to_fs(uri)
    name = txn.payload["files"][0]
    fs.makedirs(f"{root}/txn-t1", exist_ok=True)
    fs.copy(f"{root}/_staging/t1/{name}", f"{root}/txn-t1/{name}")
    sink.abort(txn)
    assert not fs.exists(f"{root}/txn-t1") and not fs.exists(f"{root}/_staging/t1")
    assert sink.staged_txn_ids() == set() and pyarrow_ids(uri) == []
    # An abort interrupted after the staging folder was gone is found and finished too.
    fs.makedirs(f"{root}/txn-t2", exist_ok=True)
    fs.pipe_file(f"{root}/txn-t2/part-x.parquet", b"PAR1")
    assert sink.staged_txn_ids() == {"t2"}
    sink.abort(SinkTransaction(sink_id="aborty", txn_id="t2", checkpoint_id=None, payload={}))
    assert sink.staged_txn_ids() == set()


# -- tables written by the old ``manifest`` mode -----------------------------------------------


def legacy_commit(uri: str, sink_id: str, txn_id: str, *values: int, ckpt: int = 1) -> None:
    """Commit ``values`` exactly as the old manifest mode did: data and its pre-commit manifest
    stay in ``_staging/<txn>/``, the record ``_commits/<txn>.json`` lists those files."""
    fs, root = fsspec.core.url_to_fs(uri)
    staging = f"{root}/_staging/{txn_id}"
    fs.makedirs(staging, exist_ok=True)
    name = f"part-{uuid.uuid4().hex}.parquet"
    with fs.open(f"{staging}/{name}", "wb") as handle:
        pq.write_table(pa_table(values), handle)
    size = int(fs.size(f"{staging}/{name}"))
    manifest = {
        "format": 1,
        "sink_id": sink_id,
        "txn_id": txn_id,
        "checkpoint_id": ckpt,
        "files": [{"path": name, "size": size, "rows": len(values)}],
        "rows": len(values),
        "precommitted_at": time.time(),
    }
    fs.pipe_file(f"{staging}/_manifest.json", json.dumps(manifest).encode())
    record = {
        "format": 1,
        "sink_id": sink_id,
        "txn_id": txn_id,
        "checkpoint_id": ckpt,
        "files": [f"_staging/{txn_id}/{name}"],
        "rows": len(values),
        "committed_at": time.time(),
    }
    fs.makedirs(f"{root}/_commits", exist_ok=True)
    fs.pipe_file(f"{root}/_commits/{txn_id}.json", json.dumps(record).encode())


def pa_table(values: tuple[int, ...]):  # type: ignore[no-untyped-def]
    import pyarrow as pa

    return pa.Table.from_pandas(frame(*values), preserve_index=False)


def test_old_layout_is_read_then_migrated_by_the_first_commit(table: tuple[str, str]) -> None:
    uri, mode = table
    legacy_commit(uri, "legacy", "old-1", 1, 2)
    legacy_commit(uri, "legacy", "old-2", 3)
    sink = ParquetTableSink("legacy", uri, commit_mode=mode)  # type: ignore[arg-type]
    # Before any commit: the sink's readers see the old rows, plain readers do not (yet).
    assert sorted(sink.read_pandas()["order_id"]) == [1, 2, 3]
    assert sink.committed_txn_ids() == {"old-1", "old-2"} and sink.staged_txn_ids() == set()
    assert plain_readers(uri)["pyarrow"] == []
    txn = stage(sink, "new", 4, ckpt=2)

    assert sink.commit(txn) is True  # migrates first
    fs, root = fsspec.core.url_to_fs(uri)
    assert not fs.exists(f"{root}/_commits/old-1.json") and not fs.exists(f"{root}/_staging/old-1")
    assert plain_readers(uri) == {"pyarrow": [1, 2, 3, 4], "duckdb": [1, 2, 3, 4]}
    assert sorted(sink.read_pandas()["order_id"]) == [1, 2, 3, 4]
    assert sink.committed_txn_ids() == {"old-1", "old-2", "new"}
    old = SinkTransaction(sink_id="legacy", txn_id="old-1", checkpoint_id=1, payload={})
    assert sink.commit(old) is False  # a replayed commit of a migrated transaction is a no-op
    with pytest.raises(AlreadyCommittedError):
        sink.abort(old)
    manifest = json.loads(fs.cat_file(f"{root}/txn-old-1/_manifest.json"))
    assert manifest["rows"] == 2 and manifest["commit_mode"] == "migrated"


def test_migration_interrupted_after_publishing_is_finished(table: tuple[str, str]) -> None:
    """Crash after ``txn-<id>/_manifest.json`` and before the old record's deletion: both records
    exist, the rows are read once, and the next migration removes the old copy."""
    uri, mode = table
    legacy_commit(uri, "legacy", "old-1", 1, 2)
    fs, root = fsspec.core.url_to_fs(uri)
    record = fs.cat_file(f"{root}/_commits/old-1.json")
    staged = {path: fs.cat_file(path) for path in fs.find(f"{root}/_staging/old-1")}
    sink = ParquetTableSink("legacy", uri, commit_mode=mode)  # type: ignore[arg-type]
    assert sink.migrate_legacy() == ["old-1"]
    fs.makedirs(f"{root}/_commits", exist_ok=True)
    fs.pipe_file(f"{root}/_commits/old-1.json", record)  # as if the crash came before the rm
    for path, data in staged.items():
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, data)

    assert sorted(sink.read_pandas()["order_id"]) == [1, 2]
    assert plain_readers(uri)["pyarrow"] == [1, 2]
    assert sink.staged_txn_ids() == set()
    assert ParquetTableSink("legacy", uri).migrate_legacy() == ["old-1"]
    assert not fs.exists(f"{root}/_commits/old-1.json") and not fs.exists(f"{root}/_staging/old-1")
    assert sorted(sink.read_pandas()["order_id"]) == [1, 2]
