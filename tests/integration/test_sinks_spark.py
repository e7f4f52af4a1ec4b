"""Both sinks fed by real Spark DataFrames through write_spark and read back with Spark."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks import (
    ParquetTableSink,
    SinkTransactionError,
    SqlTableSink,
    TwoPhaseCommitSink,
)


def orders(spark: SparkSession, first: int, count: int) -> DataFrame:
    """A few partitions of typed rows, so Spark writes several files plus _SUCCESS and .crc."""
    return (
        spark.range(first, first + count, numPartitions=3)
        .withColumnRenamed("id", "order_id")
        .withColumn("amount", (F.col("order_id") * 1.5).cast("double"))
        .withColumn("price", (F.col("order_id") / 4).cast("decimal(10,2)"))
        .withColumn("day", F.date_add(F.lit(date(2024, 1, 1)), F.col("order_id").cast("int")))
        .withColumn("customer", F.when(F.col("order_id") % 5 == 0, None).otherwise("c"))
    )


def order_ids(df: DataFrame) -> list[int]:
    return sorted(row.order_id for row in df.select("order_id").collect())


@pytest.mark.parametrize("mode", ["rename", "copy"])
def test_parquet_sink_publishes_spark_output_once(
    spark: SparkSession, tmp_path: Path, mode: str
) -> None:
    table = tmp_path / "orders"
    sink = ParquetTableSink("spark_orders", str(table), commit_mode=mode)  # type: ignore[arg-type]
    sink.commit(_spark_txn(sink, spark, "s-e1-b0", 0, 10, ckpt=1))

    sink.write_spark("s-e1-b1", orders(spark, 10, 20))
    staging = Path(sink.staging_location("s-e1-b1"))
    assert (staging / "_SUCCESS").exists() and list(staging.glob(".*.crc"))
    txn = sink.precommit("s-e1-b1", 2)
    assert txn.payload["rows"] == 20
    assert all(name.endswith(".parquet") for name in txn.payload["files"])

    assert order_ids(sink.read_spark(spark)) == list(range(10))  # staged data is invisible
    # A plain directory read, in both modes (transaction subdirectories: recursiveFileLookup).
    directory = spark.read.option("recursiveFileLookup", "true").parquet(str(table))
    assert order_ids(directory) == list(range(10))

    assert sink.commit(txn) is True
    assert sink.commit(txn) is False
    committed = sink.read_spark(spark)
    assert committed.count() == 30 and order_ids(committed) == list(range(30))
    assert dict(committed.dtypes)["price"] == "decimal(10,2)"
    assert sorted(sink.read_pandas()["order_id"].tolist()) == list(range(30))
    directory = spark.read.option("recursiveFileLookup", "true").parquet(str(table))
    assert order_ids(directory) == list(range(30))
    assert not Path(sink.staging_location("s-e1-b1")).exists()


def _spark_txn(
    sink: TwoPhaseCommitSink, spark: SparkSession, txn_id: str, first: int, count: int, ckpt: int
) -> SinkTransaction:
    """Write Spark rows [first, first + count) into the transaction and pre-commit it."""
    sink.write_spark(txn_id, orders(spark, first, count))
    return sink.precommit(txn_id, ckpt)


def test_parquet_sink_aborts_spark_output(spark: SparkSession, tmp_path: Path) -> None:
    sink = ParquetTableSink("spark_abort", str(tmp_path / "orders"))
    sink.commit(_spark_txn(sink, spark, "kept", 0, 5, ckpt=1))
    doomed = _spark_txn(sink, spark, "doomed", 5, 5, ckpt=2)
    with pytest.raises(SinkTransactionError, match="sealed"):
        sink.write_spark("doomed", orders(spark, 100, 1))

    sink.abort(doomed)
    assert not Path(sink.staging_location("doomed")).exists()
    assert order_ids(sink.read_spark(spark)) == list(range(5))


def test_parquet_sink_reads_an_empty_table(spark: SparkSession, tmp_path: Path) -> None:
    sink = ParquetTableSink("spark_empty", str(tmp_path / "orders"))
    _spark_txn(sink, spark, "pending", 0, 3, ckpt=1)
    assert sink.read_spark(spark).count() == 0


def test_sql_sink_publishes_spark_output_once(spark: SparkSession, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'spark.sqlite'}"
    sink = SqlTableSink("spark_sql", url, "orders", key_columns=["order_id"])
    try:
        sink.commit(_spark_txn(sink, spark, "s-e1-b0", 0, 10, ckpt=1))
        txn = _spark_txn(sink, spark, "s-e1-b1", 10, 20, ckpt=2)
        assert txn.payload["rows"] == 20
        assert order_ids(sink.read_spark(spark)) == list(range(10))

        restored = SqlTableSink("spark_sql", url, "orders")
        assert restored.commit(txn) is True
        assert restored.commit(txn) is False
        restored.dispose()

        committed = sink.read_spark(spark)
        assert committed.count() == 30 and order_ids(committed) == list(range(30))
        row = committed.where("order_id = 5").first()
        assert row is not None
        assert row.amount == 7.5 and row.customer is None
        assert Decimal(str(row.price)) == Decimal("1.25")
        assert pd.Timestamp(row.day).date() == date(2024, 1, 6)
    finally:
        sink.dispose()
