"""The rule driver-action-on-batch's wrappers on this environment's classic pyspark (3.5 in CI's
spark35 lane, where the DataFrame class is ``pyspark.sql.dataframe.DataFrame``, ``rdd`` a
property and ``toPandas`` inherited from a mixin; 4.x here): each action reported once with
whether its frame reads the batch, nothing outside a watch, and ``uninstall`` gives pyspark's
own methods back.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from airflow_finalckpt.core.plan_check import Input, reads_batch
from airflow_finalckpt.spark import driver_actions
from airflow_finalckpt.spark.plans import InputTags, plan_tree


def test_actions_on_this_pysparks_frames_are_seen_once_each(spark: SparkSession) -> None:
    cls = driver_actions.frame_class(spark)
    assert cls is not None and isinstance(spark.range(1), cls)
    batch = spark.range(6).selectExpr("id", "id % 2 AS k")
    dim = spark.range(3)
    tags = InputTags()
    tags.tag(batch, Input.BATCH)
    tags.tag(dim, Input.CONSTANT)
    seen: list[tuple[str, bool]] = []

    def watch(frame: Any, name: str) -> None:
        seen.append((name, reads_batch(plan_tree(frame, tags))))

    driver_actions.install(spark)
    driver_actions.install(spark)  # idempotent: one wrapper, one report per call
    with driver_actions.watching(watch):
        batch.collect()
        batch.count()
        batch.head(2)  # head -> take -> collect: once
        batch.toPandas()
        batch.rdd.map(lambda row: row).count()
        dim.collect()
        batch.localCheckpoint()
        batch.isEmpty()
        with driver_actions.unwatched():
            batch.collect()
    batch.collect()  # no watch
    assert seen == [
        ("collect", True),
        ("count", True),
        ("head", True),
        ("toPandas", True),
        ("rdd", True),
        ("collect", False),
        ("localCheckpoint", True),
        ("isEmpty", True),
    ]

    original_collect = cls.__dict__["collect"].__wrapped__
    driver_actions.uninstall(spark)
    try:
        assert cls.__dict__["collect"] is original_collect
        seen.clear()
        with driver_actions.watching(watch):
            batch.collect()
            batch.toPandas()
        assert seen == []  # the bug of a blind check
    finally:
        driver_actions.install(spark)
