"""Issue 24's daily scenario on real Spark: stage 2 groups this day's three input files by
(event_date, key) and publishes with ``commit_mode="final"`` to Parquet, SQL (plain and with
``key_columns``), Iceberg and Delta. Whatever the batching (a cold auto run sizes its first
batch from the parts' bytes, a warm one from the hint), every sink holds 10 rows with n = 3000.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_finalckpt.core.plan_check import BatchingRefusedError, SplitKeyRepeatedError
from airflow_finalckpt.sinks import (
    DeltaTableSink,
    IcebergTableSink,
    ParquetTableSink,
    SqlTableSink,
)
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.spark.stage import BatchContext
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.hints import StorageThroughputHints, read_batch_plan
from tests.spark.daily_pipeline import run_daily, write_day_files

DAY = "2024-03-01"


def daily_counts(ctx: BatchContext) -> DataFrame:
    """What a new user writes: a plain groupBy over the stage's input parts."""
    return (
        ctx.read_parts()
        .groupBy("event_date", "key")
        .agg(F.count(F.lit(1)).alias("n"), F.sum("value").alias("total"))
    )


def _sinks(out: Path) -> list[TwoPhaseCommitSink]:
    out.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{out}/sql.db"
    return [
        ParquetTableSink("parquet", str(out / "parquet")),
        SqlTableSink("sql", url, "daily"),
        SqlTableSink("sql_keyed", url, "daily_keyed", key_columns=["event_date", "key"]),
        IcebergTableSink("iceberg", "daily.counts", warehouse=str(out / "wh")),
        DeltaTableSink("delta", str(out / "delta")),
    ]


def _assert_ten_rows_of_3000(sinks: list[TwoPhaseCommitSink]) -> None:
    for sink in sinks:
        rows = sink.read_pandas()  # type: ignore[attr-defined]
        assert (len(rows), int(rows["n"].sum())) == (10, 3000), sink.sink_id
        assert sorted(rows["key"]) == [f"k{i}" for i in range(10)], sink.sink_id
        assert set(rows["n"]) == {300} and set(rows["total"]) == {300}, sink.sink_id


def test_daily_groupby_is_right_on_the_cold_and_the_warm_run(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = write_day_files(tmp_path / "in", DAY)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    for run in ("cold", "warm"):
        hints = StorageThroughputHints(storage, "dag-daily", f"daily.{run}")
        sinks = _sinks(tmp_path / run)
        with caplog.at_level(logging.INFO, logger="airflow_finalckpt.stage"):
            results = run_daily(
                spark, tmp_path, f"daily.{run}", files, daily_counts, sinks, hints=hints
            )
        assert len(results["aggregate"].processed_splits) == 3
        _assert_ten_rows_of_3000(sinks)
        plan = read_batch_plan(storage, f"daily.{run}", "aggregate")
        assert plan is not None and plan.startswith("one batch per attempt: Aggregate")
    said = [r.getMessage() for r in caplog.records if "one batch" in r.getMessage()]
    # the cold run's batches are the day's three pending splits (said with the cause)
    assert any("Aggregate" in m and "3 pending splits run as one batch" in m for m in said)


def test_split_keys_keep_a_groupby_batched_one_day_per_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    days = ["2024-03-01", "2024-03-02", "2024-03-03"]
    files = [f for day in days for f in write_day_files(tmp_path / "in", day, files=1)]
    sinks = _sinks(tmp_path / "out")[:2]
    results = run_daily(
        spark,
        tmp_path,
        "keyed",
        files,
        daily_counts,
        sinks,
        batch_size=1,
        split_keys=["event_date"],
    )
    assert len(results["aggregate"].processed_splits) == 3
    for sink in sinks:
        rows = sink.read_pandas()  # type: ignore[attr-defined]
        assert len(rows) == 30 and set(rows["n"]) == {100}, sink.sink_id
        assert sorted(set(rows["event_date"])) == days


def test_a_split_key_value_in_two_batches_fails_the_stage(
    spark: SparkSession, tmp_path: Path
) -> None:
    files = write_day_files(tmp_path / "in", DAY, files=2)  # one day over two splits
    sinks = _sinks(tmp_path / "out")[:1]
    with pytest.raises(SplitKeyRepeatedError) as refused:
        run_daily(
            spark,
            tmp_path,
            "bad",
            files,
            daily_counts,
            sinks,
            batch_size=1,
            split_keys=["event_date"],
        )
    message = str(refused.value)
    assert "'aggregate'" in message and f'["{DAY}"]' in message and "in batch" in message
    assert sinks[0].read_pandas().empty  # type: ignore[attr-defined]


def test_a_fixed_batch_size_on_a_groupby_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    files = write_day_files(tmp_path / "in", DAY)
    sinks = _sinks(tmp_path / "out")[:1]
    with pytest.raises(BatchingRefusedError) as refused:
        run_daily(spark, tmp_path, "fixed", files, daily_counts, sinks, batch_size=2)
    message = str(refused.value)
    for part in ("'aggregate'", "batch_size=2", "Aggregate", "split_keys=", "'auto'", "aggregat"):
        assert part in message
    assert sinks[0].read_pandas().empty  # type: ignore[attr-defined]
