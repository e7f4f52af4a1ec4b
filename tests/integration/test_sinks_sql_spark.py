"""SqlTableSink.write_spark on real Spark (local[2]) into a real SQLite file and a real PostgreSQL
database: the executors stage their partitions in parallel (COPY / executemany), nothing is
collected into the driver, retried task attempts stage nothing twice, a failed Spark write cannot
be pre-committed, and the commit moves the staged rows in one database transaction.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pandas
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlalchemy import func, select, text

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks import SinkTransactionError, SqlTableSink
from airflow_finalckpt.sinks.sql import WRITES_TABLE, estimated_bytes
from airflow_finalckpt.sinks.sql_staging import PartitionWrite, stage_partition


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'spark_sinks.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def make_sink(db_url: str) -> Iterator:
    created: list[SqlTableSink] = []
    table = f"orders_{uuid.uuid4().hex[:8]}"

    def factory(**options: object) -> SqlTableSink:
        options.setdefault("driver_write_max_bytes", 0)  # these tests stage from the executors
        sink = SqlTableSink("spark_orders", db_url, table, **options)  # type: ignore[arg-type]
        created.append(sink)
        return sink

    yield factory
    for sink in created:
        sink.dispose()


def orders(spark: SparkSession, first: int, count: int, partitions: int = 8) -> DataFrame:
    return (
        spark.range(first, first + count, numPartitions=partitions)
        .withColumnRenamed("id", "order_id")
        .withColumn("amount", (F.col("order_id") * 1.5).cast("double"))
        .withColumn("price", (F.col("order_id") / 4).cast("decimal(10,2)"))
        .withColumn("day", F.date_add(F.lit(date(2024, 1, 1)), F.col("order_id").cast("int")))
        .withColumn(
            "at",
            F.timestamp_seconds(F.lit(1_704_067_200) + F.col("order_id")),
        )
        .withColumn(
            "customer",
            F.when(F.col("order_id") % 5 == 0, None)
            .when(F.col("order_id") % 5 == 1, "")
            .otherwise(F.concat(F.lit('c,"'), F.col("order_id").cast("string"), F.lit("\n"))),
        )
        .withColumn("vip", F.col("order_id") % 2 == 0)
    )


def staged_rows(sink: SqlTableSink) -> int:
    with sink.engine.connect() as conn:
        query = text(f'SELECT count(*) FROM "{sink.staging_table_name}"')
        return int(conn.execute(query).scalar_one())


def write_records(sink: SqlTableSink) -> int:
    with sink.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {WRITES_TABLE}")).scalar_one())


def test_partitions_stage_in_parallel_and_commit_once(spark: SparkSession, make_sink) -> None:
    sink = make_sink()
    sink.write_spark("t-b0", orders(spark, 0, 400))
    sink.write_spark("t-b0", orders(spark, 400, 100, partitions=3))  # a second write, same txn
    assert staged_rows(sink) == 500 and sink.read_pandas().empty
    txn = sink.precommit("t-b0", 1)
    assert txn.payload["rows"] == 500

    restored = make_sink()
    assert restored.commit(SinkTransaction.model_validate_json(txn.model_dump_json())) is True
    assert restored.commit(txn) is False
    data = sink.read_pandas().sort_values("order_id").reset_index(drop=True)
    assert data["order_id"].tolist() == list(range(500))
    assert staged_rows(sink) == 0 and write_records(sink) == 0
    assert sink.staged_txn_ids() == set()

    row = data.iloc[6]
    assert row["amount"] == 9.0 and Decimal(str(row["price"])) == Decimal("1.50")
    assert str(row["day"])[:10] == "2024-01-07" and row["customer"] == ""
    assert data.iloc[5]["customer"] is None and data.iloc[7]["customer"] == 'c,"7\n'
    assert bool(data.iloc[6]["vip"]) is True
    at = row["at"]
    at = at if isinstance(at, datetime) else datetime.fromisoformat(str(at))
    expected = datetime(2024, 1, 1, 0, 0, 6, tzinfo=UTC)
    assert at.replace(tzinfo=at.tzinfo or UTC) == expected


def test_key_columns_upsert_from_spark(spark: SparkSession, make_sink) -> None:
    sink = make_sink(key_columns=["order_id"])
    sink.write_spark("a", orders(spark, 0, 50).select("order_id", "amount"))
    sink.commit(sink.precommit("a", 1))
    update = orders(spark, 40, 20).select("order_id", (F.col("amount") * 0 - 1).alias("amount"))
    sink.write_spark("b", update)
    sink.commit(sink.precommit("b", 2))
    data = sink.read_pandas().set_index("order_id")["amount"]
    assert len(data) == 60 and data[39] == 58.5 and data[40] == -1 and data[59] == -1


def test_a_retried_task_attempt_stages_nothing_twice(make_sink) -> None:
    """What a second attempt of one partition's task (Spark retry or speculation) does when the
    first attempt's database transaction committed: it finds the claim and stages nothing."""
    sink = make_sink()
    batch = pa.RecordBatch.from_pydict({"order_id": [1, 2, 3], "amount": [1.0, 2.0, 3.0]})
    sink.write_arrow("seed", pa.Table.from_batches([batch]).slice(0, 0))  # creates the tables
    spec = open_write(sink, "t1", "w1")
    assert stage_partition(spec, 0, iter([batch])) == 3
    assert stage_partition(spec, 0, iter([batch])) == 3  # the retry: same count, no rows
    assert stage_partition(spec, 1, iter([batch.slice(0, 1)])) == 1
    assert staged_rows(sink) == 4
    with pytest.raises(SinkTransactionError, match="did not complete"):
        sink.precommit("t1", 1)  # the driver never marked write w1 complete
    sink._complete_write("t1", "w1", 4)
    assert sink.precommit("t1", 1).payload["rows"] == 4


def open_write(sink: SqlTableSink, txn_id: str, write_id: str) -> PartitionWrite:
    """What write_spark does before its job runs: the write's open row, and the tasks' spec."""
    with sink.engine.begin() as conn:
        sink._books.open_write(conn, txn_id, write_id)
    url = sink.engine.url.render_as_string(hide_password=False)
    return PartitionWrite(
        url, sink.sink_id, txn_id, write_id, sink.staging_table_name, ("order_id",)
    )


def test_a_partition_staging_after_the_abort_stages_nothing(make_sink) -> None:
    """A task of a failed Spark job that runs on after the sink aborted the transaction (Spark
    reports the job failed before it has stopped the job's other tasks) is fenced out."""
    sink = make_sink()
    batch = pa.RecordBatch.from_pydict({"order_id": [1, 2, 3]})
    sink.write_arrow("seed", pa.Table.from_batches([batch]).slice(0, 0))  # creates the tables
    spec = open_write(sink, "t1", "w1")
    assert stage_partition(spec, 0, iter([batch])) == 3
    sink.abort(SinkTransaction(sink_id=sink.sink_id, txn_id="t1", checkpoint_id=None))
    with pytest.raises(
        SinkTransactionError, match=r"no open write 'w1' .* partition 1 staged nothing"
    ):
        stage_partition(spec, 1, iter([batch]))
    assert staged_rows(sink) == 0 and write_records(sink) == 0
    assert sink.staged_txn_ids() == set()


def test_abort_waits_for_a_partition_that_is_staging(make_sink) -> None:
    """An abort racing a partition in the middle of its load: the abort waits for it (PostgreSQL:
    the partition holds the write's open row) or the partition then finds the write gone
    (SQLite converts its rows before it takes the write lock, so the abort ends first: the
    test waits for that before it lets the partition go on, or the partition could take the
    lock first and stage, and the abort remove its rows afterwards, which is right too but not
    this case); either way nothing stays staged."""
    sink = make_sink()
    batch = pa.RecordBatch.from_pydict({"order_id": [1, 2, 3]})
    sink.write_arrow("seed", pa.Table.from_batches([batch]).slice(0, 0))
    spec = open_write(sink, "t1", "w1")
    loading, release = threading.Event(), threading.Event()

    def slow_batches() -> Iterator[pa.RecordBatch]:
        yield batch
        loading.set()
        assert release.wait(60)
        yield batch

    outcome: list[object] = []

    def partition() -> None:
        try:
            outcome.append(stage_partition(spec, 0, slow_batches()))
        except SinkTransactionError as exc:
            outcome.append(exc)

    staging = threading.Thread(target=partition)
    staging.start()
    assert loading.wait(60)
    aborting = threading.Thread(
        target=sink.abort,
        args=(SinkTransaction(sink_id=sink.sink_id, txn_id="t1", checkpoint_id=None),),
    )
    aborting.start()
    if sink.engine.dialect.name == "postgresql":
        aborting.join(1.0)
        assert aborting.is_alive()  # it waits for the partition's transaction
    else:
        aborting.join(60)
        assert not aborting.is_alive()  # nothing holds the write lock while rows convert
    release.set()
    staging.join(60)
    aborting.join(60)
    assert not staging.is_alive() and not aborting.is_alive()
    assert staged_rows(sink) == 0 and write_records(sink) == 0
    assert sink.staged_txn_ids() == set()
    if sink.engine.dialect.name == "postgresql":
        assert outcome == [6]  # it staged, then the abort removed its rows
    else:
        assert len(outcome) == 1 and isinstance(outcome[0], SinkTransactionError)


def test_a_failed_spark_write_cannot_be_precommitted(spark: SparkSession, make_sink) -> None:
    sink = make_sink()
    sink.write_spark("kept", orders(spark, 0, 10))
    sink.commit(sink.precommit("kept", 1))

    # The last partition fails while Spark computes it; the others may be staged already.
    explode_late = F.when(F.col("order_id") >= 90, F.raise_error(F.lit("boom"))).otherwise("ok")
    bad = orders(spark, 0, 100, partitions=4).withColumn("customer", explode_late)
    with pytest.raises(Exception, match="boom"):
        sink.write_spark("doomed", bad)
    with pytest.raises(SinkTransactionError, match="did not complete"):
        sink.precommit("doomed", 2)
    assert "doomed" in sink.staged_txn_ids()
    sink.abort(SinkTransaction(sink_id=sink.sink_id, txn_id="doomed", checkpoint_id=None))
    assert staged_rows(sink) == 0 and sink.staged_txn_ids() == set()
    with sink.engine.connect() as conn:
        target = sink._data_tables()[0]  # type: ignore[index]
        assert conn.execute(select(func.count()).select_from(target)).scalar_one() == 10


def test_sealed_transaction_refuses_a_spark_write(spark: SparkSession, make_sink) -> None:
    sink = make_sink()
    sink.write_spark("t", orders(spark, 0, 5))
    sink.precommit("t", 1)
    with pytest.raises(SinkTransactionError, match="sealed"):
        sink.write_spark("t", orders(spark, 5, 5))
    assert staged_rows(sink) == 5


def test_a_small_frame_is_staged_by_the_driver_a_large_one_by_the_executors(
    spark: SparkSession, make_sink, tmp_path: Path
) -> None:
    """The size Spark estimates for the plan decides (a Parquet scan: its file size); the
    driver stages a small frame as one partition; both paths stage the same values."""
    orders(spark, 0, 3000).write.parquet(str(tmp_path / "orders"))
    frame = spark.read.parquet(str(tmp_path / "orders")).repartition(4)
    estimate = estimated_bytes(frame)
    assert estimate is not None and estimate > 0

    def claimed_partitions(sink: SqlTableSink) -> int:
        with sink.engine.connect() as conn:
            query = text(f"SELECT count(*) FROM {WRITES_TABLE} WHERE part >= 0")
            return int(conn.execute(query).scalar_one())

    small = make_sink(driver_write_max_bytes=estimate)
    small.write_spark("small", frame)
    assert claimed_partitions(small) == 1
    small.commit(small.precommit("small", 1))
    through_driver = small.read_pandas().sort_values("order_id").reset_index(drop=True)
    large = make_sink(driver_write_max_bytes=estimate - 1)
    large.write_spark("large", frame)
    assert claimed_partitions(large) == 4  # one per Spark task
    large.commit(large.precommit("large", 2))
    both = large.read_pandas()
    assert len(through_driver) == 3000 and len(both) == 6000
    # the executors' copy of each row equals the driver's: duplicates collapse to one each
    distinct = both.drop_duplicates().sort_values("order_id").reset_index(drop=True)
    pandas.testing.assert_frame_equal(distinct, through_driver)
