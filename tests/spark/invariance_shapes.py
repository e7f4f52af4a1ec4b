"""The transform shapes of the batch-invariance matrix (``batch_invariance.py``) and their input.

Every shape is a stage transform as a DAG author writes it. ``batchable``: True for split-local
shapes (and for shapes made incremental with keyed state), False for shapes whose result over two
batches differs from the union of their per-batch results, None where it does not in fact (a
union of two batch inputs) but a conservative check may still refuse it. The synthetic events
are six days (one split each) whose keys, join ids and duplicates span days on purpose.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from airflow_finalckpt.examples.nycflights13 import stages, transforms
from airflow_finalckpt.examples.nycflights13.data import first_days, split_path
from airflow_finalckpt.examples.nycflights13.data import prepare_inputs as flights
from airflow_finalckpt.spark.aggregate import (
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
from airflow_finalckpt.spark.stage import BatchContext, Transform

# Spark's Python workers cannot import this module (it is not a package of the repository):
# the functions it hands to Spark travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
# ... and run this interpreter (with pandas), not the first python3 on the PATH; set before the
# session starts (pytest imports this module while collecting, before any fixture runs).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

SEED = 24
DAYS = tuple(f"2024-03-0{d}" for d in range(1, 7))
ROWS_PER_DAY = 40
FLIGHT_DAYS = 3
EVENT_SCHEMA = (
    "event_date string, key string, kind string, id long, amount long, price double, "
    "qty decimal(10,2), ts long, tags array<string>"
)


@dataclass(frozen=True)
class Inputs:
    """Input parts per upstream stage directory (``data/<dir>/<part>`` handles) and the
    nycflights13 input directory the example's enrich reads its dimension files from.
    """

    parts_root: Path
    parts: dict[str, tuple[str, ...]]
    flights_dir: str


@dataclass(frozen=True)
class Shape:
    name: str
    #: The stage's code, built for the prepared inputs: (transform, finish hook).
    build: Callable[[Inputs], tuple[Transform, Transform | None]]
    batchable: bool | None = True
    split_keys: tuple[str, ...] = ()
    #: The upstream directory whose parts are the stage's splits.
    primary: str = "src"
    #: Upstream stages read whole (``ctx.upstream``).
    whole: tuple[str, ...] = ()
    #: An independent plain job (None: the stage's transform once over all its splits).
    plain: Callable[[SparkSession, Inputs], DataFrame] | None = field(default=None)

    @property
    def input_dirs(self) -> tuple[str, ...]:
        return (self.primary, *self.whole)

    def splits(self, inputs: Inputs) -> tuple[str, ...]:
        return inputs.parts[self.primary]

    def upstream(self, inputs: Inputs) -> dict[str, list[str]]:
        return {name: list(inputs.parts[name]) for name in self.whole}


# -- input ------------------------------------------------------------------------------------


def prepare_inputs(spark: SparkSession, root: Path) -> Inputs:
    """Write the events (one part per day), the dimension part and the example's parts."""
    parts_root = root / "parts"
    parts: dict[str, tuple[str, ...]] = {"src": (), "dims": ("data/dims/all",)}
    rng = random.Random(SEED)
    stamps = list(range(len(DAYS) * ROWS_PER_DAY))
    rng.shuffle(stamps)
    for index, day in enumerate(DAYS):
        rows = [_event(rng, day, stamps[index * ROWS_PER_DAY + j]) for j in range(ROWS_PER_DAY)]
        _write(spark.createDataFrame(rows, EVENT_SCHEMA), parts_root / "src" / day)
        parts["src"] += (f"data/src/{day}",)
    dims = [(f"k{i}", f"label-{i}", i * 10) for i in range(4)]  # k4 and null keys: no match
    _write(
        spark.createDataFrame(dims, "key string, label string, weight long"),
        parts_root / "dims" / "all",
    )
    layout = flights(root / "flights", days=first_days(FLIGHT_DAYS))
    all_dims = transforms.load_dims(spark, layout)
    parts["ingest"], parts["enrich"] = (), ()
    for split in layout.split_ids:
        ingested = transforms.ingest(spark, [str(split_path(layout, split))])
        _write(ingested, parts_root / "ingest" / split)
        enriched = transforms.enrich(
            spark, spark.read.parquet(str(parts_root / "ingest" / split)), all_dims
        )
        _write(enriched, parts_root / "enrich" / split)
        parts["ingest"] += (f"data/ingest/{split}",)
        parts["enrich"] += (f"data/enrich/{split}",)
    return Inputs(parts_root, parts, str(root / "flights"))


def _event(rng: random.Random, day: str, ts: int) -> tuple[object, ...]:
    key = None if rng.random() < 0.04 else f"k{rng.randrange(5)}"
    amount = None if rng.random() < 0.1 else rng.randrange(-50, 100)
    tags = rng.sample(["x", "y", "z"], rng.randrange(4))
    qty = Decimal(rng.randrange(0, 100_000)) / 100
    stamp = int(dt.datetime.fromisoformat(day).timestamp()) * 1000 + ts
    return (
        day,
        key,
        rng.choice("ab"),
        rng.randrange(40),
        amount,
        round(rng.uniform(0, 100), 3),
        qty,
        stamp,
        tags,
    )


def _write(frame: DataFrame, path: Path) -> None:
    frame.coalesce(1).write.parquet(f"file://{path}")


# -- shapes -----------------------------------------------------------------------------------


def _per_batch(
    fn: Callable[[BatchContext, DataFrame], DataFrame],
) -> Callable[[Inputs], tuple[Transform, None]]:
    """A shape whose transform is ``fn`` over the batch's parts."""

    def build(_inputs: Inputs) -> tuple[Transform, None]:
        return (lambda ctx: fn(ctx, ctx.read_parts())), None

    return build


def _sides(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    a = events.where(F.col("kind") == "a").select("id", "key", "amount")
    b = events.where(F.col("kind") == "b").select(
        "id", F.col("key").alias("b_key"), F.col("ts").alias("b_ts")
    )
    return a, b


def _grouped_pandas(events: DataFrame) -> DataFrame:
    """Rows and summed amounts per key in a grouped pandas UDF (``applyInPandas``)."""

    def per_key(frame: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "key": [frame["key"].iloc[0]],
                "n": [len(frame)],
                "total": [int(frame["amount"].fillna(0).sum())],
            }
        )

    return events.groupBy("key").applyInPandas(per_key, "key string, n long, total long")


TOTALS = IncrementalAggregate(
    "totals",
    keys=["key"],
    aggs={
        "n": count(),
        "n_amount": count("amount"),
        "amount": sum_("amount"),
        "lo_price": min_("price"),
        "hi_qty": max_("qty"),
        "avg_price": mean("price"),
        "avg_qty": mean("qty"),
        "kinds": count_distinct("kind"),
        "ids": count_distinct("id"),
        "first_id": first("id", by="ts"),
        "last_amount": last("amount", by="ts"),
    },
)


def _totals_plain(spark: SparkSession, inputs: Inputs) -> DataFrame:
    """The same aggregation written as the plain PySpark job (independent of TOTALS)."""
    events = spark.read.parquet(*[f"file://{inputs.parts_root}/src/{d}" for d in DAYS])
    return events.groupBy("key").agg(
        F.count(F.lit(1)).alias("n"),
        F.count("amount").alias("n_amount"),
        F.sum("amount").alias("amount"),
        F.min("price").alias("lo_price"),
        F.max("qty").alias("hi_qty"),
        F.avg("price").alias("avg_price"),
        F.avg("qty").alias("avg_qty"),
        F.count_distinct("kind").alias("kinds"),
        F.count_distinct("id").alias("ids"),
        F.min_by("id", "ts").alias("first_id"),
        F.max_by("amount", "ts").alias("last_amount"),
    )


def _totals(_inputs: Inputs) -> tuple[Transform, Transform]:
    return (lambda ctx: TOTALS.update(ctx, ctx.read_parts())), TOTALS.result


def _example_enrich(inputs: Inputs) -> tuple[Transform, None]:
    return stages.enrich_transform(inputs.flights_dir), None


def _example_windows(_inputs: Inputs) -> tuple[Transform, Transform]:
    return stages.windows_transform, stages.windows_finish


def _window_fn(events: DataFrame) -> DataFrame:
    by_key = Window.partitionBy("key").orderBy("ts")
    return events.select(
        "key",
        "ts",
        F.row_number().over(by_key).alias("rank"),
        F.sum("amount").over(by_key).alias("running"),
    )


def _driver_collect(ctx: BatchContext, events: DataFrame) -> DataFrame:
    """Rows and summed amounts per key computed on the driver from the collected rows."""
    totals: dict[str | None, list[int]] = {}
    for row in events.select("key", "amount").collect():
        entry = totals.setdefault(row.key, [0, 0])
        entry[0] += 1
        entry[1] += row.amount or 0
    rows = [(key, n, total) for key, (n, total) in totals.items()]
    return ctx.spark.createDataFrame(rows, "key string, n long, total long")


def _driver_pandas(ctx: BatchContext, events: DataFrame) -> DataFrame:
    """The same through pandas: toPandas(), a pandas groupby, createDataFrame."""
    frame = events.select("key", "amount", "price").toPandas().fillna({"key": "(none)"})
    grouped = frame.groupby("key", as_index=False).agg(
        n=("amount", "size"), total=("amount", "sum"), top_price=("price", "max")
    )
    grouped["total"] = grouped["total"].astype("int64")
    return ctx.spark.createDataFrame(grouped, "key string, n long, total long, top_price double")


def _count_filter(events: DataFrame) -> DataFrame:
    """A count of the batch used in a later filter (ids below a tenth of the row count)."""
    n = events.count()
    return events.where(F.col("id") < F.lit(n) / 10).select("ts", "key", "id")


def _split_key_window(events: DataFrame) -> DataFrame:
    by_day_key = Window.partitionBy("event_date", "key").orderBy("ts")
    return events.select("event_date", "key", "ts", F.row_number().over(by_day_key).alias("rank"))


SHAPES: tuple[Shape, ...] = (
    Shape(
        "filter_project",
        _per_batch(
            lambda _c, e: e.where(F.col("amount") > 10).select(
                "event_date", "key", (F.col("amount") * 2).alias("double_amount"), "price"
            )
        ),
    ),
    Shape(
        "explode",
        _per_batch(lambda _c, e: e.select("key", "ts", F.explode_outer("tags").alias("tag"))),
    ),
    Shape(
        "join_broadcast_dim",
        _per_batch(
            lambda c, e: e.join(
                F.broadcast(c.broadcast_table("dims", lambda: c.upstream("dims"))), "key", "left"
            ).select("ts", "key", "label", (F.col("amount") * F.col("weight")).alias("weighted"))
        ),
        whole=("dims",),
    ),
    Shape(
        "join_attempt_dim",
        _per_batch(
            lambda c, e: e.join(
                c.attempt_value("dims", lambda: c.upstream("dims").cache()), "key", "inner"
            ).select("ts", "key", "label")
        ),
        whole=("dims",),
    ),
    Shape(
        "union_two",
        _per_batch(
            lambda _c, e: _sides(e)[0].unionByName(
                _sides(e)[1].select(
                    "id", F.col("b_key").alias("key"), F.col("b_ts").alias("amount")
                )
            )
        ),
        batchable=None,
    ),
    Shape(
        "join_two", _per_batch(lambda _c, e: _sides(e)[0].join(_sides(e)[1], "id")), batchable=False
    ),
    Shape(
        "group_agg",
        _per_batch(
            lambda _c, e: e.groupBy("key").agg(
                F.count(F.lit(1)).alias("n"),
                F.sum("amount").alias("amount"),
                F.avg("price").alias("avg_price"),
            )
        ),
        batchable=False,
    ),
    Shape(
        "window_fn",
        _per_batch(lambda _c, e: _window_fn(e)),
        batchable=False,
    ),
    Shape(
        "drop_duplicates",
        _per_batch(lambda _c, e: e.select("key", "amount").dropDuplicates()),
        batchable=False,
    ),
    Shape(
        "distinct", _per_batch(lambda _c, e: e.select("key", "kind").distinct()), batchable=False
    ),
    Shape(
        "order_limit",
        _per_batch(lambda _c, e: e.orderBy("ts").limit(7).select("ts", "key", "amount")),
        batchable=False,
    ),
    Shape(
        "grouped_pandas_udf",
        _per_batch(lambda _c, e: _grouped_pandas(e)),
        batchable=False,
    ),
    Shape("incremental_aggregate", _totals, plain=_totals_plain),
    Shape(
        "split_key_group",
        _per_batch(
            lambda _c, e: e.groupBy("event_date", "key").agg(
                F.count(F.lit(1)).alias("n"),
                F.sum("amount").alias("amount"),
                F.count_distinct("id").alias("ids"),
            )
        ),
        batchable=False,
        split_keys=("event_date",),
    ),
    Shape(
        "split_key_window",
        _per_batch(lambda _c, e: _split_key_window(e)),
        batchable=False,
        split_keys=("event_date",),
    ),
    # actions on the batch run on the driver while the transform is called: the returned plan
    # is a local relation or a literal filter (rule driver-action-on-batch)
    Shape("driver_collect", _per_batch(_driver_collect), batchable=False),
    Shape("driver_to_pandas", _per_batch(_driver_pandas), batchable=False),
    Shape("driver_count_filter", _per_batch(lambda _c, e: _count_filter(e)), batchable=False),
    Shape("example_enrich", _example_enrich, primary="ingest"),
    Shape("example_delay_windows", _example_windows, primary="enrich"),
    Shape(
        "example_carrier_daily",
        _per_batch(lambda _c, e: transforms.carrier_daily(e)),
        primary="enrich",
        batchable=False,
        split_keys=("day",),
    ),
)
