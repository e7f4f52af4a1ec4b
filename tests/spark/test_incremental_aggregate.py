"""Incremental aggregation on real Spark through the real runtime: the committed result equals
the plain ``groupBy(keys).agg(...)`` over the input the stage read, column types included,
whether the input ends at the last batch, at a drain (the finish hook emits) or after a stop
with savepoint and a resume. (Crashes at every batching: ``test_batch_invariance.py``.)
"""

from __future__ import annotations

import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StopMode
from airflow_finalckpt.runtime.runner import CommitMode, RunStatus, StageRunner, StageSpec
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.spark.aggregate import (
    AggregateError,
    IncrementalAggregate,
    count,
    count_distinct,
    first,
    last,
    max_,
    mean,
    min_,
    sum_,
)
from airflow_finalckpt.spark.stage import BatchContext, SparkStageLogic, TransformError
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

SPLITS = ("s0", "s1", "s2", "s3")
SCHEMA = "split string, key string, amount long, price double, qty decimal(8,2), ts long"
TOTALS = IncrementalAggregate(
    "totals",
    keys=["key"],
    aggs={
        "n": count(),
        "amount": sum_("amount"),
        "lo": min_("price"),
        "hi": max_("qty"),
        "avg_price": mean("price"),
        "avg_qty": mean("qty"),
        "amounts": count_distinct("amount"),
        "first_amount": first("amount", by="ts"),
        "last_price": last("price", by="ts"),
    },
)


def _rows(split: str) -> list[tuple[Any, ...]]:
    """Rows whose keys span every split; null keys, null values; ts unique over all splits."""
    index = int(split[1:])
    rows = []
    for j in range(6):
        key = None if j == 5 else f"k{(index + j) % 3}"
        amount = None if (index + j) % 4 == 0 else index * 10 + j
        qty = Decimal(index * 100 + j) / 4
        rows.append((split, key, amount, 0.1 * (j + index), qty, index * 10 + j))
    return rows


def _source(ctx: BatchContext) -> DataFrame:
    return ctx.spark.createDataFrame([r for s in ctx.splits for r in _rows(s)], SCHEMA)


def _aggregate(ctx: BatchContext) -> DataFrame | None:
    return TOTALS.update(ctx, _source(ctx))


def _plain(spark: SparkSession, splits: tuple[str, ...]) -> DataFrame:
    return TOTALS.plain(spark.createDataFrame([r for s in splits for r in _rows(s)], SCHEMA))


class _Stage:
    """One source stage running the aggregate, with a sink committed at its final checkpoint."""

    def __init__(self, spark: SparkSession, tmp_path: Path) -> None:
        engine = make_engine(f"sqlite:///{tmp_path}/store.db")
        ensure_schema(engine)
        self.spark = spark
        self.storage = CheckpointStorage(str(tmp_path / "checkpoints"))
        self.coord = Coordinator(engine, "agg", writer=self.storage)
        self.coord.register(StageGraph.from_edges(["a"], []))
        self.sink = ParquetTableSink("out", str(tmp_path / "out"))
        self.batches: list[bool] = []

    def runner(self, fault: Any = None) -> StageRunner:
        def transform(ctx: BatchContext) -> DataFrame | None:
            self.batches.append(ctx.last_batch)
            return _aggregate(ctx)

        logic = SparkStageLogic(
            self.spark,
            self.storage,
            "agg",
            "a",
            transform,
            on_finish=TOTALS.result,
            sinks=[self.sink],
        )
        spec = StageSpec(
            pipeline_key="agg",
            stage_id="a",
            splits=SPLITS,
            batch_size=1,
            commit_mode=CommitMode.FINAL,
            checkpoint_interval_s=3600.0,
        )
        return StageRunner(
            self.coord, spec, logic, [self.sink], output_handle=logic.output_handle, fault=fault
        )

    def close(self, runner: StageRunner) -> None:
        deadline = time.monotonic() + 60
        while runner.try_close() is None:
            assert time.monotonic() < deadline, "no final checkpoint within 60 s"
            self.coord.ensure_final_checkpoint("a")
            time.sleep(0.02)

    def committed(self) -> DataFrame:
        return self.sink.read_spark(self.spark)


def _assert_equal(actual: DataFrame, expected: DataFrame) -> None:
    types = [(f.name, f.dataType.simpleString()) for f in expected.schema.fields]
    assert [(f.name, f.dataType.simpleString()) for f in actual.schema.fields] == types
    assert ("avg_qty", "decimal(12,6)") in types and ("n", "bigint") in types

    def rows(frame: DataFrame) -> Counter[tuple[Any, ...]]:
        return Counter(
            tuple(round(v, 9) if isinstance(v, float) else v for v in row)
            for row in frame.collect()
        )

    assert rows(actual) == rows(expected)


def test_the_last_batch_emits_the_plain_aggregation_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    stage = _Stage(spark, tmp_path)
    runner = stage.runner()
    result = runner.run()
    stage.close(runner)
    assert result.status is RunStatus.FINISHED
    assert stage.batches == [False, False, False, True]
    # the last batch dropped the state: nothing is kept once the result is out
    assert not [h for h in stage.coord.stage("a").progress.state if "totals" in h.name]
    _assert_equal(stage.committed(), _plain(spark, SPLITS))


def test_a_drain_emits_what_was_read_from_the_finish_hook(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A drained source stops taking input after two splits: no last batch ever runs, the
    finish hook emits the aggregate of the splits read."""
    stage = _Stage(spark, tmp_path)
    recorded = []

    def drain_after_two(point: str) -> None:
        if point == "after-record-batch":
            recorded.append(point)
            if len(recorded) == 2:
                stage.coord.request_stop(StopMode.DRAIN)

    runner = stage.runner(drain_after_two)
    runner.run()
    stage.close(runner)
    assert stage.batches == [False, False]
    _assert_equal(stage.committed(), _plain(spark, SPLITS[:2]))


def test_a_savepoint_keeps_the_partials_and_the_resume_completes_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    stage = _Stage(spark, tmp_path)
    recorded = []

    def savepoint_after_one(point: str) -> None:
        if point == "after-record-batch":
            recorded.append(point)
            if len(recorded) == 1:
                stage.coord.request_stop(StopMode.SAVEPOINT)

    assert stage.runner(savepoint_after_one).run().status is RunStatus.SUSPENDED
    assert not stage.sink.committed_txn_ids()
    names = {h.name for h in stage.coord.stage("a").progress.state}
    assert "state:totals" in names
    stage.coord.resume()
    runner = stage.runner()
    runner.run()
    stage.close(runner)
    assert stage.batches == [False, False, False, True]
    _assert_equal(stage.committed(), _plain(spark, SPLITS))


def test_a_state_written_by_another_declaration_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    stage = _Stage(spark, tmp_path)
    crashed = []

    def crash_after_one(point: str) -> None:
        if point == "after-record-batch" and not crashed:
            crashed.append(point)
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        stage.runner(crash_after_one).run()
    renamed = IncrementalAggregate("totals", keys=["key"], aggs={"rows": count()})

    def other(ctx: BatchContext) -> DataFrame | None:
        return renamed.update(ctx, _source(ctx))

    logic = SparkStageLogic(spark, stage.storage, "agg", "a", other)
    spec = StageSpec(pipeline_key="agg", stage_id="a", splits=SPLITS, batch_size=1)
    with pytest.raises(TransformError, match="restore it with the keys and aggregates"):
        StageRunner(stage.coord, spec, logic, output_handle=logic.output_handle).run()


def test_a_missing_input_column_names_the_aggregate(spark: SparkSession) -> None:
    frame = spark.createDataFrame([("k", 1)], "key string, other long")
    with pytest.raises(AggregateError, match=r"'totals'.*\['amount', 'price', 'qty', 'ts'\]"):
        TOTALS.plain(frame)
