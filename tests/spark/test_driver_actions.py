"""Issue 42, item 1: Spark actions a transform runs on its batch on the driver are seen.

The user's reproduction: a daily pipeline whose second stage counts events per key on the
driver (``collect()`` or ``toPandas()`` of its batch, then ``createDataFrame``), with
``batch_size=1`` over three input files of 1,000 events. Before the rule
``driver-action-on-batch`` it committed 30 rows (one per key per batch) with success; now a fixed
batch size is refused naming the rule, and ``batch_size="auto"`` runs the day as one batch and
commits the plain job's 10 rows. Actions over inputs the same for every batch (a dimension
built in ``attempt_value``) do not count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_finalckpt.core.batching import BatchSample, Throughput
from airflow_finalckpt.core.plan_check import (
    DRIVER_ACTION_RULE,
    BatchingRefusedError,
    Verdict,
)
from airflow_finalckpt.runtime.values import Batch
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.spark.stage import BatchContext, SparkStageLogic, spark_path
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.hints import StorageThroughputHints
from tests.spark.daily_pipeline import run_daily, write_day_files

DAY = "2024-03-01"
#: A measured throughput of one byte per second: an auto batch takes one split.
ONE_FILE_PER_BATCH = Throughput(0.0, 1.0, by_bytes=True, samples=(BatchSample(1, 1.0, 1.0),))
COUNTS = "event_date string, key string, n long, total long"


def collected_counts(ctx: BatchContext) -> DataFrame:
    """Counts per key computed on the driver from the batch's collected rows."""
    counts: dict[tuple[str, str], list[int]] = {}
    for row in ctx.read_parts().select("event_date", "key", "value").collect():
        entry = counts.setdefault((row.event_date, row.key), [0, 0])
        entry[0] += 1
        entry[1] += row.value
    return ctx.spark.createDataFrame([(*k, n, t) for k, (n, t) in counts.items()], COUNTS)


def pandas_counts(ctx: BatchContext) -> DataFrame:
    """The same with pandas: ``toPandas()`` of the batch, a pandas groupby, back to Spark."""
    frame = ctx.read_parts().toPandas()
    grouped = frame.groupby(["event_date", "key"], as_index=False).agg(
        n=("value", "size"), total=("value", "sum")
    )
    return ctx.spark.createDataFrame(grouped, COUNTS)


def _sinks(out: Path) -> list[TwoPhaseCommitSink]:
    out.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{out}/sql.db"
    return [
        ParquetTableSink("parquet", str(out / "parquet")),
        SqlTableSink("sql_keyed", url, "daily_keyed", key_columns=["event_date", "key"]),
    ]


def _committed(sinks: list[TwoPhaseCommitSink]) -> list[tuple[int, int]]:
    """Per sink: committed rows and the events they count."""
    found = []
    for sink in sinks:
        rows = sink.read_pandas()  # type: ignore[attr-defined]
        found.append((len(rows), int(rows["n"].sum()) if len(rows) else 0))
    return found


@pytest.mark.parametrize("transform", [collected_counts, pandas_counts], ids=lambda f: f.__name__)
def test_driver_side_counts_per_key_commit_the_plain_jobs_ten_rows(
    spark: SparkSession,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    transform: Callable[[BatchContext], DataFrame],
) -> None:
    """batch_size="auto" with a stored throughput that sizes batches of one file (as the
    issue's batch_size=1): the rule widens the first batch to the day's three files."""
    files = write_day_files(tmp_path / "in", DAY)
    sinks = _sinks(tmp_path / "out")
    hints = StorageThroughputHints(CheckpointStorage(str(tmp_path / "checkpoints")), "daily")
    hints.save("aggregate", ONE_FILE_PER_BATCH)
    with caplog.at_level(logging.INFO, logger="airflow_finalckpt.stage"):
        results = run_daily(spark, tmp_path, "driver", files, transform, sinks, hints=hints)
    assert len(results["aggregate"].processed_splits) == 3
    assert _committed(sinks) == [(10, 3000), (10, 3000)]
    said = [r.getMessage() for r in caplog.records if DRIVER_ACTION_RULE in r.getMessage()]
    assert said and "one batch" in said[0], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("transform", [collected_counts, pandas_counts], ids=lambda f: f.__name__)
def test_batch_size_1_on_driver_side_counts_is_refused_naming_the_rule(
    spark: SparkSession, tmp_path: Path, transform: Callable[[BatchContext], DataFrame]
) -> None:
    files = write_day_files(tmp_path / "in", DAY)
    sinks = _sinks(tmp_path / "out")
    with pytest.raises(BatchingRefusedError) as refused:
        run_daily(spark, tmp_path, "fixed", files, transform, sinks, batch_size=1)
    message = str(refused.value)
    action = "collect()" if transform is collected_counts else "toPandas()"
    for part in ("'aggregate'", "batch_size=1", action, DRIVER_ACTION_RULE, "'auto'"):
        assert part in message, message
    assert _committed(sinks) == [(0, 0), (0, 0)]  # nothing committed


def test_an_action_on_a_dimension_built_once_keeps_the_stage_batched(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A dimension collected to the driver inside ``attempt_value`` is the same for every
    batch: batch_size=1 runs (one batch per file) and every event is labelled."""
    dim_path = tmp_path / "dim"
    spark.createDataFrame(
        [(f"k{i}", f"label-{i}") for i in range(10)], "key string, label string"
    ).write.parquet(spark_path(str(dim_path)))

    def labelled(ctx: BatchContext) -> DataFrame:
        labels = ctx.attempt_value(
            "labels",
            lambda: dict(ctx.spark.read.parquet(spark_path(str(dim_path))).collect()),
        )
        mapping = F.create_map(*[F.lit(x) for kv in sorted(labels.items()) for x in kv])
        return ctx.read_parts().select(
            "event_date",
            "key",
            F.lit(1).cast("long").alias("n"),
            mapping[F.col("key")].alias("label"),
        )

    sinks = [ParquetTableSink("parquet", str(tmp_path / "out"))]
    results = run_daily(
        spark,
        tmp_path,
        "dims",
        write_day_files(tmp_path / "in", DAY),
        labelled,
        sinks,
        batch_size=1,
    )
    assert len(results["aggregate"].processed_splits) == 3
    rows = sinks[0].read_pandas()  # type: ignore[attr-defined]
    assert len(rows) == 3000 and set(rows["label"]) == {f"label-{i}" for i in range(10)}


# -- what the watch sees (one stage logic, its batches called by hand) -------------------------


@pytest.fixture
def logic(spark: SparkSession, tmp_path: Path) -> SparkStageLogic:
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    for part in ("p1", "p2"):
        spark.range(5).selectExpr("id", "id % 2 as k").write.parquet(
            spark_path(storage.resolve_handle("pk", f"data/src/{part}"))
        )
    return SparkStageLogic(spark, storage, "pk", "s", lambda ctx: None)


def _verdict(logic: SparkStageLogic, transform: Callable[[BatchContext], Any]) -> Any:
    logic.transform = transform
    return logic.check_plan(Batch(0, "b0", ("data/src/p1",)))


@pytest.mark.parametrize(
    "action",
    [
        lambda b: b.collect(),
        lambda b: b.toPandas(),
        lambda b: b.count(),
        lambda b: b.head(2),  # head -> take -> collect: reported once, as head
        lambda b: b.first(),
        lambda b: b.isEmpty(),
        lambda b: b.rdd.map(lambda r: r).collect(),
        lambda b: b.groupBy("k").count().toLocalIterator(),
        lambda b: b.localCheckpoint(),
    ],
)
def test_every_driver_action_on_the_batch_is_seen(
    logic: SparkStageLogic, action: Callable[[DataFrame], Any]
) -> None:
    def transform(ctx: BatchContext) -> DataFrame:
        batch = ctx.read_parts()
        action(batch.where("id >= 0"))
        return batch

    check = _verdict(logic, transform)
    assert check.verdict is Verdict.WHOLE_INPUT and check.rule == DRIVER_ACTION_RULE
    assert len(logic.driver_actions) == 1, logic.driver_actions


def test_a_count_used_in_a_later_filter_is_seen(logic: SparkStageLogic) -> None:
    def transform(ctx: BatchContext) -> DataFrame:
        batch = ctx.read_parts()
        return batch.where(F.col("id") < batch.count() / 2)

    check = _verdict(logic, transform)
    assert (check.verdict, check.operator) == (Verdict.WHOLE_INPUT, "count()")


def test_actions_off_the_batch_are_not_counted(logic: SparkStageLogic, spark: SparkSession) -> None:
    """Constant inputs (an upstream read whole, an attempt value, a broadcast table), keyed
    state, the runtime's own writes, and actions outside the transform call."""
    logic.upstream_manifests = {"dim": ["data/src/p2"]}

    def transform(ctx: BatchContext) -> DataFrame:
        ctx.upstream("dim").collect()
        ctx.attempt_value("n", lambda: ctx.spark.range(3).count())
        ctx.broadcast_table("b", lambda: ctx.upstream("dim")).count()
        spark.range(3).collect()  # a leaf nobody tagged: taken as the batch's, see below
        return ctx.read_parts()

    assert _verdict(logic, transform).verdict is Verdict.WHOLE_INPUT  # the untagged range
    assert logic.driver_actions == ["collect"]

    def constant_only(ctx: BatchContext) -> DataFrame:
        ctx.upstream("dim").collect()
        ctx.attempt_value("n", lambda: ctx.spark.range(3).count())
        ctx.broadcast_table("b", lambda: ctx.upstream("dim")).count()
        return ctx.read_parts()

    assert _verdict(logic, constant_only).verdict is Verdict.SPLIT_LOCAL
    assert logic.driver_actions == []
    spark.range(3).count()  # no transform is being called: nothing to report
    assert logic.driver_actions == []
