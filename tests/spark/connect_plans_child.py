"""Child process of test_plan_translation_connect: a local Spark Connect server (its own JVM,
so it never meets the suite's classic session) and the verdicts of Connect plans, as JSON."""

from __future__ import annotations

import json
import sys
import tempfile

import pandas as pd
from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

from airflow_finalckpt.core.plan_check import Input, check_plan, reads_batch
from airflow_finalckpt.spark import driver_actions
from airflow_finalckpt.spark.plans import InputTags, plan_tree


def main() -> None:
    spark = SparkSession.builder.remote("local[1]").getOrCreate()
    path = tempfile.mkdtemp() + "/events.parquet"
    pd.DataFrame({"event_date": ["d1"], "key": ["a"], "value": [1]}).to_parquet(path)
    batch = spark.read.parquet(path)
    dim = spark.createDataFrame(pd.DataFrame({"key": ["a"], "name": ["A"]}))
    tags = InputTags()
    tags.tag(batch, Input.BATCH)
    tags.tag(dim, Input.CONSTANT)
    shapes = {
        "filter": batch.where("value > 0").withColumn("v2", F.col("value") + 1),
        "left join with a constant": batch.join(dim, "key", "left"),
        "right join keeps the constant": batch.join(dim, "key", "right"),
        "self join": batch.join(batch.select("key"), "key"),
        "groupBy": batch.groupBy("key").agg(F.count("*")),
        "groupBy with the split key": batch.groupBy("event_date", "key").count(),
        "window with the split key": batch.withColumn(
            "r", F.row_number().over(Window.partitionBy("event_date").orderBy("value"))
        ),
        "window": batch.withColumn("r", F.row_number().over(Window.orderBy("value"))),
        "dropDuplicates": batch.dropDuplicates(["key"]),
        "orderBy+limit": batch.orderBy("value").limit(1),
        "union with a constant": batch.select("key").union(dim.select("key")),
        "applyInPandas": batch.groupBy("key").applyInPandas(lambda p: p, batch.schema),
        # analysed on the server: not visible client-side, so not taken as split-local
        "spark.sql": spark.sql("SELECT key, count(*) AS n FROM {t} GROUP BY key", t=batch),
    }
    verdicts = {}
    for name, frame in shapes.items():
        check = check_plan(plan_tree(frame, tags), ("event_date",))
        verdicts[name] = [check.verdict.value, check.operator]
    # the rule driver-action-on-batch on the Connect client's frames: each action reported
    # once, with whether its frame reads the batch
    seen: list[list[object]] = []
    driver_actions.install(spark)
    with driver_actions.watching(
        lambda frame, name: seen.append([name, reads_batch(plan_tree(frame, tags))])
    ):
        batch.collect()
        batch.toPandas()
        dim.count()
        batch.groupBy("key").count().head(1)
        batch.where(F.col("value") < batch.count())
    batch.collect()  # no watch: not reported
    verdicts["driver actions"] = seen  # type: ignore[assignment]
    spark.stop()
    json.dump(verdicts, sys.stdout)


if __name__ == "__main__":
    main()
