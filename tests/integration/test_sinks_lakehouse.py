"""Iceberg and Delta Lake sinks on a real local Spark, read back by pyiceberg, deltalake, DuckDB."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakehouse_helpers import (
    KINDS,
    commit_count,
    make_sink,
    read_ids,
    staged_data_files,
    table_files,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks import (
    AlreadyCommittedError,
    DeltaTableSink,
    IcebergTableSink,
    NotPrecommittedError,
    SinkError,
    SinkTransactionError,
)
from airflow_finalckpt.sinks.staged import STAGING_DIR, StagedTableSink


def orders(spark: SparkSession, first: int, count: int, partitions: int = 3) -> DataFrame:
    """Typed rows over several partitions, so one batch is several data files."""
    return (
        spark.range(first, first + count, numPartitions=partitions)
        .withColumnRenamed("id", "order_id")
        .withColumn("amount", (F.col("order_id") * 1.5).cast("double"))
        .withColumn("price", (F.col("order_id") / 4).cast("decimal(10,2)"))
        .withColumn("day", F.date_add(F.lit(date(2024, 1, 1)), F.col("order_id").cast("int")))
        .withColumn("placed_at", F.timestamp_seconds(F.col("order_id") * 3600 + 1_700_000_000))
        .withColumn("customer", F.when(F.col("order_id") % 5 == 0, None).otherwise("c"))
    )


@pytest.mark.parametrize("kind", KINDS)
def test_spark_batches_are_published_once_and_readable_by_other_engines(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    sink = make_sink(kind, tmp_path)
    sink.write_spark("s.b0.e1", orders(spark, 0, 30))
    txn = sink.precommit("s.b0.e1", 1)
    assert txn.payload["rows"] == 30 and len(txn.payload["files"]) == 3
    assert read_ids(sink) == []  # staged files are in no snapshot / version
    assert sink.staged_txn_ids() == {"s.b0.e1"}
    with pytest.raises(SinkTransactionError, match="sealed"):
        sink.write_spark("s.b0.e1", orders(spark, 99, 1))

    assert sink.commit(txn) is True
    assert sink.commit(txn) is False
    assert make_sink(kind, tmp_path).commit(txn) is False  # a fresh object after a "crash"
    sink.write_spark("s.b1.e1", orders(spark, 30, 20))
    assert sink.commit(sink.precommit("s.b1.e1", 2)) is True

    assert read_ids(sink) == list(range(50))
    assert commit_count(sink) == 2
    assert sink.committed_txn_ids() == {"s.b0.e1", "s.b1.e1"}
    assert sink.staged_txn_ids() == set()
    files = table_files(sink)
    assert files == staged_data_files(sink) and len(files) == 6  # nothing leaked, nothing else

    con = duckdb.connect()
    found = con.execute(
        "SELECT count(*), count(DISTINCT order_id), min(typeof(placed_at)), min(placed_at), "
        "sum(price) FROM read_parquet(?)",
        [sorted(files)],
    ).fetchone()
    assert found is not None
    count, distinct, at_type, first_at, price_sum = found
    assert (count, distinct) == (50, 50)
    assert at_type == "TIMESTAMP WITH TIME ZONE"
    assert first_at.timestamp() == 1_700_000_000
    assert float(price_sum) == sum(round(i / 4, 2) for i in range(50))
    for path in files:  # microsecond INT64 timestamps, never INT96
        index = pq.read_schema(path).get_field_index("placed_at")
        column = pq.ParquetFile(path).schema.column(index)
        assert column.physical_type == "INT64" and "MICROS" in str(column.logical_type).upper()


def test_iceberg_files_carry_the_table_field_ids_and_snapshot_summary(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = IcebergTableSink("ice", "db.orders", warehouse=str(tmp_path / "warehouse"))
    sink.write_spark("t1", orders(spark, 0, 5))
    sink.commit(sink.precommit("t1", 7))
    table = sink.table()
    assert table is not None
    ids = {field.name: field.field_id for field in table.schema().fields}
    for path in table_files(sink):
        schema = pq.read_schema(path)
        assert {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in schema} == ids
    (snapshot,) = table.snapshots()
    assert snapshot.summary is not None
    assert snapshot.summary["finalckpt.txn-id"] == "t1"
    assert snapshot.summary["finalckpt.checkpoint-id"] == "7"
    assert snapshot.summary["added-records"] == "5"
    assert table.scan().to_arrow().schema.field("placed_at").type == pa.timestamp("us", tz="UTC")


def test_delta_commit_carries_an_application_transaction(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = DeltaTableSink("dl", str(tmp_path / "t"), app_id="pipe-1-dl")
    for n in range(3):
        sink.write_spark(f"t{n}", orders(spark, n * 10, 10))
        assert sink.commit(sink.precommit(f"t{n}", n + 1)) is True
    delta = sink.table()
    assert delta is not None
    assert delta.version() == 2 and delta.transaction_version("pipe-1-dl") == 3
    history = {entry["version"]: entry for entry in delta.history()}
    assert [history[v]["finalckpt.txn-id"] for v in range(3)] == ["t0", "t1", "t2"]
    assert delta.to_pyarrow_table().num_rows == 30


@pytest.mark.parametrize("kind", KINDS)
def test_abort_deletes_the_staged_files(spark: SparkSession, tmp_path: Path, kind: str) -> None:
    sink = make_sink(kind, tmp_path)
    sink.write_spark("kept", orders(spark, 0, 5))
    kept = sink.precommit("kept", 1)
    sink.commit(kept)
    sink.write_spark("dropped", orders(spark, 5, 5))
    dropped = sink.precommit("dropped", 2)
    staging = Path(sink.staging_location("dropped"))
    assert staging.is_dir()

    sink.abort(dropped)
    sink.abort(dropped)  # twice: a no-op
    assert not staging.exists()
    assert sink.staged_txn_ids() == set()
    with pytest.raises(NotPrecommittedError):
        sink.commit(dropped)
    with pytest.raises(AlreadyCommittedError):
        sink.abort(kept)
    assert read_ids(sink) == list(range(5)) and commit_count(sink) == 1
    assert staged_data_files(sink) == table_files(sink)


def _views(reader: StagedTableSink, con: duckdb.DuckDBPyConnection) -> dict[str, list[int]]:
    """``order_id`` values of one table version, as each engine reads it: the format library
    (pyiceberg scan / deltalake to pandas) and DuckDB (over the library's snapshot, and over
    the snapshot's data files with its own Parquet reader). Each view loads the table anew."""
    views: dict[str, list[int]] = {}
    if isinstance(reader, IcebergTableSink):
        table = reader.table()
        if table is None or table.current_snapshot() is None:
            return {}
        scan = table.scan(selected_fields=("order_id",))
        views["pyiceberg scan"] = scan.to_arrow().column("order_id").to_pylist()
        scan.to_duckdb("orders", connection=con)
        files = [task.file.file_path for task in scan.plan_files()]
    else:
        assert isinstance(reader, DeltaTableSink)
        delta = reader.table()
        if delta is None:
            return {}
        views["deltalake to_pandas"] = delta.to_pandas(columns=["order_id"])["order_id"].tolist()
        con.register("orders", delta.to_pyarrow_dataset())
        files = [str(uri) for uri in delta.file_uris()]
    views["duckdb over the library"] = [
        row[0] for row in con.execute("SELECT order_id FROM orders").fetchall()
    ]
    views["duckdb read_parquet"] = (
        [row[0] for row in con.execute("SELECT order_id FROM read_parquet(?)", [files]).fetchall()]
        if files
        else []
    )
    return views


def _read_until(
    done: threading.Event,
    reader: StagedTableSink,
    size: int,
    seen: dict[str, list[int]],
    errors: list[str],
) -> None:
    """Read through every engine until ``done``: note each view's row count in ``seen``, and in
    ``errors`` a view that is not whole batches of ``size`` ids in commit order."""
    con = duckdb.connect()
    while not done.is_set():
        try:
            views = _views(reader, con)
        except Exception as exc:
            errors.append(repr(exc))
            return
        for engine, ids in views.items():
            if len(ids) % size or sorted(ids) != list(range(len(ids))):
                errors.append(f"{engine}: partial view of {len(ids)} rows")
            seen.setdefault(engine, []).append(len(ids))


@pytest.mark.parametrize("kind", KINDS)
def test_a_concurrent_reader_never_sees_a_partial_batch(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    """Readers of every engine, each in its own thread, read while batches are committed: every
    read sees a whole number of batches, in commit order (a prefix of the ids), never part of
    one, although each batch is several data files."""
    batches, size = 8, 40
    sink = make_sink(kind, tmp_path)
    txns = []
    for n in range(batches):  # stage everything first: only the commits race the readers
        sink.write_spark(f"b{n}", orders(spark, n * size, size, partitions=4))
        txns.append(sink.precommit(f"b{n}", n + 1))
    assert all(len(txn.payload["files"]) == 4 for txn in txns)
    seen: dict[str, list[int]] = {}
    errors: list[str] = []
    done = threading.Event()

    def read() -> None:
        _read_until(done, make_sink(kind, tmp_path), size, seen, errors)

    threads = [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for txn in txns:
            assert sink.commit(txn) is True
            time.sleep(0.05)  # let the readers see intermediate versions
    finally:
        done.set()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert len(seen) == 3, seen
    for engine, counts in seen.items():
        between = {c for c in counts if 0 < c < batches * size}
        assert between, f"{engine} never read while commits were going on: {counts}"
    assert read_ids(sink) == list(range(batches * size))
    assert commit_count(sink) == batches


@pytest.mark.parametrize("kind", KINDS)
def test_a_table_with_another_schema_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    sink = make_sink(kind, tmp_path)
    sink.write_spark("t1", orders(spark, 0, 5))
    sink.commit(sink.precommit("t1", 1))
    before = staged_data_files(sink)
    other = orders(spark, 5, 5).withColumn("amount", F.col("amount").cast("string"))
    with pytest.raises(SinkError) as refused:
        sink.write_spark("t2", other.withColumn("extra", F.lit(1)))
    message = str(refused.value)
    assert "\n" not in message and "another schema" in message
    assert "extra" in message and "amount" in message
    assert staged_data_files(sink) == before  # nothing was written
    assert not Path(sink.staging_location("t2")).exists()
    sink.write_spark("t2", orders(spark, 5, 5))  # the right schema still goes in
    sink.commit(sink.precommit("t2", 2))
    assert read_ids(sink) == list(range(10)) and commit_count(sink) == 2


def test_an_unreachable_catalog_is_a_one_line_error_and_retryable(
    spark: SparkSession, tmp_path: Path
) -> None:
    rest = IcebergTableSink("ice", "db.t", catalog={"type": "rest", "uri": "http://127.0.0.1:9"})
    with pytest.raises(SinkError) as unreachable:
        rest.write_spark("t1", orders(spark, 0, 5))
    assert "\n" not in str(unreachable.value) and "rest catalog" in str(unreachable.value)

    catalog_dir = tmp_path / "catalog-volume"  # not mounted yet: SQLite cannot open the file
    sink = IcebergTableSink(
        "ice",
        "db.t",
        warehouse=f"file://{tmp_path / 'warehouse'}",
        catalog=f"sqlite:///{catalog_dir / 'catalog.db'}",
    )
    with pytest.raises(SinkError) as failed:
        sink.write_spark("t1", orders(spark, 0, 5))
    assert "\n" not in str(failed.value) and "sql catalog" in str(failed.value)
    assert not (tmp_path / "warehouse" / "db").exists()  # nothing written
    catalog_dir.mkdir()  # the catalog is back: the same transaction goes through
    sink.write_spark("t1", orders(spark, 0, 5))
    assert sink.commit(sink.precommit("t1", 1)) is True
    assert read_ids(sink) == list(range(5)) and commit_count(sink) == 1


#: Runs one write in a child that root's DAC override does not apply to (chmod 000 binds root
#: otherwise not at all); prints the error message.
WRITE_IN_CHILD = """
import sys
from pyspark.sql import SparkSession
from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink, SinkError
kind, root = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("OFF")
if kind == "iceberg":
    sink = IcebergTableSink("orders", "db.orders", warehouse=root + "/warehouse")
else:
    sink = DeltaTableSink("orders", root + "/delta/orders")
try:
    sink.write_spark("t2", spark.range(5, 10).withColumnRenamed("id", "order_id"))
    sink.precommit("t2", 2)
except SinkError as exc:
    print("SinkError:", exc)
else:
    print("written")
"""


def _unprivileged() -> list[str]:
    if os.geteuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_path_without_permission_is_a_one_line_error_and_retryable(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    sink = make_sink(kind, tmp_path)
    sink.write_spark("t1", spark.range(0, 5).withColumnRenamed("id", "order_id"))
    sink.commit(sink.precommit("t1", 1))
    root = sink._data_root()
    assert root is not None
    locked = Path(root) / STAGING_DIR if kind == "iceberg" else Path(root)
    locked.chmod(0)
    try:
        child = subprocess.run(
            [*_unprivileged(), sys.executable, "-c", WRITE_IN_CHILD, kind, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        locked.chmod(0o755)
    lines = [line for line in child.stdout.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("SinkError: "), child.stdout + child.stderr[-3000:]
    assert "ermission" in lines[-1] or "denied" in lines[-1].lower(), lines[-1]
    assert commit_count(sink) == 1 and read_ids(sink) == list(range(5))  # nothing committed
    for txn_id in sink.staged_txn_ids():  # the retry aborts what the failure left behind
        sink.abort(SinkTransaction(sink_id=sink.sink_id, txn_id=txn_id, checkpoint_id=0))
    sink.write_spark("t2", spark.range(5, 10).withColumnRenamed("id", "order_id"))
    assert sink.commit(sink.precommit("t2", 2)) is True
    assert read_ids(sink) == list(range(10)) and commit_count(sink) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_racing_committers_of_one_transaction_publish_it_once(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    sink = make_sink(kind, tmp_path)
    sink.write_spark("t0", orders(spark, 0, 5))
    sink.commit(sink.precommit("t0", 1))  # the table exists: both race on the same append
    sink.write_spark("t1", orders(spark, 5, 5))
    txn = sink.precommit("t1", 2)
    results: list[bool] = []
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def commit() -> None:
        committer = make_sink(kind, tmp_path)  # another process's view: no shared state
        start.wait()
        try:
            results.append(committer.commit(txn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=commit) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and sorted(results) == [False, False, True]
    assert read_ids(sink) == list(range(10)) and commit_count(sink) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_nested_types_and_later_nulls_fit_the_table_the_first_batch_created(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    sink = make_sink(kind, tmp_path)
    strict = spark.range(0, 4).select(
        F.col("id").alias("order_id"),
        F.struct(F.col("id").alias("n"), F.lit("x").alias("tag")).alias("detail"),
        F.array(F.col("id"), F.col("id") + 1).alias("lines"),
    )  # Spark says: nothing nullable, nested or not
    sink.write_spark("t1", strict)
    sink.commit(sink.precommit("t1", 1))
    loose = spark.createDataFrame(
        [(4, (None, None), [None, 5])],
        "order_id long, detail struct<n:long,tag:string>, lines array<long>",
    )
    sink.write_spark("t2", loose)
    assert sink.commit(sink.precommit("t2", 2)) is True
    table = sink.read_arrow()
    by_id = dict(zip(table.column("order_id").to_pylist(), table.to_pylist(), strict=True))
    assert sorted(by_id) == [0, 1, 2, 3, 4]
    assert by_id[1]["detail"] == {"n": 1, "tag": "x"} and by_id[1]["lines"] == [1, 2]
    assert by_id[4]["detail"] == {"n": None, "tag": None} and by_id[4]["lines"] == [None, 5]


@pytest.mark.parametrize("kind", KINDS)
def test_pandas_frames_with_nanosecond_timestamps_are_staged_as_microseconds(
    tmp_path: Path, kind: str
) -> None:
    import pandas as pd

    sink = make_sink(kind, tmp_path)
    frame = pd.DataFrame(
        {
            "order_id": [1, 2],
            "placed_at": pd.to_datetime(
                ["2024-01-01 10:00:00.123456789", "2024-01-02 00:00:00.000000001"], utc=True
            ),
        }
    )
    sink.write_pandas("t1", frame)
    txn = sink.precommit("t1", 1)
    assert sink.commit(txn) is True
    (path,) = table_files(sink)
    assert pq.read_schema(path).field("placed_at").type == pa.timestamp("us", tz="UTC")
    read = sink.read_arrow()
    assert read.column("order_id").to_pylist() == [1, 2]
    assert read.column("placed_at")[0].as_py().microsecond == 123456
