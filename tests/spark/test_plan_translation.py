"""The classic Spark adapter (``spark.plans``): real frames' analyzed plans, read in one py4j
call without running a Spark job, give the verdicts of docs/protocol.md's table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from airflow_finalckpt.core.plan_check import Input, Verdict, check_plan
from airflow_finalckpt.spark.plans import InputTags, plan_tree

Shape = Callable[[DataFrame, DataFrame], DataFrame]


@pytest.fixture(scope="module")
def frames(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple:  # type: ignore[type-arg]
    """A batch input read from files and a constant dimension (as broadcast_table holds it)."""
    path = tmp_path_factory.mktemp("plans") / "events"
    pd.DataFrame(
        {"event_date": ["d1", "d2"], "key": ["a", "b"], "value": [1, 2], "tags": ["x,y", "z"]}
    ).to_parquet(path.with_suffix(".parquet"), index=False)
    events = spark.read.parquet(str(path.with_suffix(".parquet")))
    dim = spark.createDataFrame(pd.DataFrame({"key": ["a"], "name": ["A"]}))
    return events, dim


def _udf(batch: DataFrame, dim: DataFrame) -> DataFrame:
    plus = F.udf(lambda v: v + 1, "long")
    return batch.withColumn("v2", plus("value"))


SPLIT_LOCAL: dict[str, Shape] = {
    "project+filter": lambda b, d: b.select("key", "value").where("value > 0"),
    "explode": lambda b, d: b.withColumn("tag", F.explode(F.split("tags", ","))),
    "record-wise udf": _udf,
    "mapInPandas": lambda b, d: b.mapInPandas(lambda it: it, b.schema),
    "sortWithinPartitions": lambda b, d: b.sortWithinPartitions("value"),
    "repartition": lambda b, d: b.repartition(3, "key"),
    "broadcast left join with a constant": lambda b, d: b.join(F.broadcast(d), "key", "left"),
    "inner join with a constant": lambda b, d: b.join(d, "key"),
    "union of batch inputs": lambda b, d: b.unionByName(b.where("value > 1")),
    # enrich's shape: one dimension joined twice (Spark gives the copy new attribute ids)
    "a constant joined twice": lambda b, d: b.join(d, "key", "left").join(
        d.select("key", F.col("name").alias("name2")), "key", "left"
    ),
}
WHOLE_INPUT: dict[str, tuple[Shape, str]] = {
    "groupBy": (lambda b, d: b.groupBy("key").agg(F.count("*")), "Aggregate"),
    "global agg": (lambda b, d: b.agg(F.sum("value")), "Aggregate"),
    "rollup": (lambda b, d: b.rollup("event_date", "key").count(), "Aggregate"),
    "window": (
        lambda b, d: b.withColumn(
            "r", F.row_number().over(Window.partitionBy("key").orderBy("value"))
        ),
        "Window",
    ),
    "distinct": (lambda b, d: b.distinct(), "Deduplicate"),
    "dropDuplicates": (lambda b, d: b.dropDuplicates(["key"]), "Deduplicate"),
    "orderBy": (lambda b, d: b.orderBy("value"), "Sort"),
    "limit": (lambda b, d: b.limit(1), "Limit"),
    "orderBy+limit": (lambda b, d: b.orderBy("value").limit(1), "Sort"),
    "self join": (lambda b, d: b.join(b.select("key", F.col("value").alias("v2")), "key"), "Join"),
    "right join keeps the constant": (lambda b, d: b.join(d, "key", "right"), "Join"),
    "union with a constant": (lambda b, d: b.select("key").union(d.select("key")), "Union"),
    "applyInPandas": (
        lambda b, d: b.groupBy("key").applyInPandas(lambda p: p, b.schema),
        "FlatMapGroupsInPandas",
    ),
    "scalar subquery": (
        lambda b, d: b.where(F.col("value") > b.select(F.avg("value")).scalar()),  # type: ignore[operator]
        "Aggregate",
    ),
}


def _check(frame: DataFrame, tags: InputTags, split_keys: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    return check_plan(plan_tree(frame, tags), split_keys)


def _tags(events: DataFrame, dim: DataFrame) -> InputTags:
    tags = InputTags()
    tags.tag(events, Input.BATCH)
    tags.tag(dim, Input.CONSTANT)
    return tags


@pytest.mark.parametrize("shape", sorted(SPLIT_LOCAL))
def test_split_local_shapes(frames: tuple, shape: str) -> None:  # type: ignore[type-arg]
    events, dim = frames
    assert (
        _check(SPLIT_LOCAL[shape](events, dim), _tags(events, dim)).verdict is Verdict.SPLIT_LOCAL
    )


@pytest.mark.parametrize("shape", sorted(WHOLE_INPUT))
def test_shapes_that_need_the_whole_input(frames: tuple, shape: str) -> None:  # type: ignore[type-arg]
    events, dim = frames
    build, operator = WHOLE_INPUT[shape]
    check = _check(build(events, dim), _tags(events, dim))
    assert check.verdict is Verdict.WHOLE_INPUT, check
    assert check.operator == operator, check


def test_grouping_by_the_split_keys_and_their_aliases(frames: tuple) -> None:  # type: ignore[type-arg]
    events, dim = frames
    tags = _tags(events, dim)
    daily = events.groupBy("event_date", "key").agg(F.count("*").alias("n"))
    assert _check(daily, tags, ("event_date",)).verdict is Verdict.SPLIT_KEYED
    # carrier_daily's shape: the split column renamed in the groupBy, then projected
    renamed = events.groupBy(F.col("event_date").alias("day"), "key").count().select("day", "count")
    assert (
        _check(
            renamed.withColumnRenamed("count", "n") if False else renamed, tags, ("day",)
        ).verdict
        is Verdict.SPLIT_KEYED
    )
    window = events.withColumn(
        "r", F.rank().over(Window.partitionBy("event_date").orderBy("value"))
    )
    assert _check(window, tags, ("event_date",)).verdict is Verdict.SPLIT_KEYED
    assert _check(events.dropDuplicates(["event_date", "key"]), tags, ("event_date",)).verdict is (
        Verdict.SPLIT_KEYED
    )
    # a rollup's grand total leaves the split key out: never batchable
    rollup = events.rollup("event_date", "key").count()
    assert _check(rollup, tags, ("event_date",)).verdict is Verdict.WHOLE_INPUT


def test_untagged_leaves_count_as_batch_input(frames: tuple) -> None:  # type: ignore[type-arg]
    events, dim = frames
    tags = InputTags()
    tags.tag(events, Input.BATCH)  # dim not tagged: a join of two batch inputs
    check = _check(events.join(dim, "key", "left"), tags)
    assert check.verdict is Verdict.WHOLE_INPUT and check.operator == "Join"


def test_the_check_runs_no_spark_job(spark: SparkSession, frames: tuple) -> None:  # type: ignore[type-arg]
    events, dim = frames
    tracker = spark.sparkContext.statusTracker()
    tags = _tags(events, dim)
    _check(events.limit(1), tags)  # warm up the py4j path
    before = len(tracker.getJobIdsForGroup(None))
    for build, _ in WHOLE_INPUT.values():
        if build is not WHOLE_INPUT["scalar subquery"][0]:
            _check(build(events, dim), tags)
    assert len(tracker.getJobIdsForGroup(None)) == before


def test_reading_parts_inside_the_logic_tags_them(spark: SparkSession, tmp_path: Path) -> None:
    from airflow_finalckpt.spark.stage import SparkStageLogic
    from airflow_finalckpt.storage import CheckpointStorage

    storage = CheckpointStorage(str(tmp_path))
    logic = SparkStageLogic(spark, storage, "p", "s", lambda ctx: None)
    pdf = pd.DataFrame({"key": ["a"], "value": [1]})
    spark.createDataFrame(pdf).write.parquet(str(tmp_path / "p" / "data" / "up" / "b1"))
    logic.upstream_manifests = {"up": ["data/up/b1"]}
    from airflow_finalckpt.runtime.runner import Batch

    def whole_upstream(ctx):  # type: ignore[no-untyped-def]
        return ctx.read_parts().join(ctx.upstream("up").select("key"), "key", "left")

    logic.transform = whole_upstream
    check = logic.check_plan(Batch(index=0, key="k", splits=("data/up/b1",)))
    # this batch's parts, joined with an upstream read whole (the same for every batch)
    assert check is not None and check.verdict is Verdict.SPLIT_LOCAL
    logic.transform = lambda ctx: ctx.upstream("up")
    check = logic.check_plan(Batch(index=0, key="k", splits=("data/up/b1",)))
    assert check is not None and check.verdict is Verdict.WHOLE_INPUT
