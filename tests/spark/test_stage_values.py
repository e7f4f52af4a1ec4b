"""Stage-global state vs per-attempt values on real Spark, through the real runtime.

``ctx.global_state`` is checkpointed: computed once per stage, restored by a later attempt
without calling its factory again. ``ctx.attempt_value`` is not: built once per attempt, reused
by that attempt's batches, built again by the next attempt. Auto batches are sized by input
bytes when the splits are upstream output parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.runtime.runner import StageRunner, StageSpec
from airflow_finalckpt.spark.stage import BatchContext, SparkStageLogic
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "values"
SPLITS = tuple(f"s{i}" for i in range(4))


class Crash(RuntimeError):
    pass


def _setup(tmp_path: Path) -> tuple[Coordinator, CheckpointStorage]:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(StageGraph.from_edges(["a"], []))
    return coord, storage


def test_global_state_is_restored_and_attempt_values_are_rebuilt(
    spark: SparkSession, tmp_path: Path
) -> None:
    coord, storage = _setup(tmp_path)
    calls = {"global": 0, "attempt": 0, "batches": 0}
    crash_at = {"batch": 2}

    def transform(ctx: BatchContext) -> DataFrame:
        def lookup() -> DataFrame:
            calls["global"] += 1
            return ctx.spark.createDataFrame(
                [(s, i) for i, s in enumerate(SPLITS)], "s string, i long"
            )

        def factor() -> int:
            calls["attempt"] += 1
            return 10

        table = ctx.global_state("lookup", lookup)
        scale = ctx.attempt_value("factor", factor)
        calls["batches"] += 1
        if calls["batches"] == crash_at["batch"]:
            raise Crash("crash in the second batch")
        rows = ctx.spark.createDataFrame([(s,) for s in ctx.splits], "s string")
        return rows.join(table, "s").select("s", (F.col("i") * scale).alias("v"))

    def runner() -> StageRunner:
        logic = SparkStageLogic(spark, storage, KEY, "a", transform)
        spec = StageSpec(pipeline_key=KEY, stage_id="a", splits=SPLITS, batch_size=1)
        return StageRunner(coord, spec, logic, output_handle=logic.output_handle)

    with pytest.raises(Exception, match="crash in the second batch"):
        runner().run()
    assert calls == {"global": 1, "attempt": 1, "batches": 2}
    crash_at["batch"] = -1
    result = runner().run()
    # the lookup was restored from the checkpointed state; the factor was built again once
    assert calls["global"] == 1 and calls["attempt"] == 2
    assert len(result.processed_splits) == 3
    parts = [
        p
        for h in coord.stage("a").progress.state
        if h.name.startswith("output:")
        for p in h.name.removeprefix("output:").split(",")
    ]
    out = spark.read.parquet(*[f"file://{storage.resolve_handle(KEY, p)}" for p in parts])
    assert sorted((r["s"], r["v"]) for r in out.collect()) == [
        (s, 10 * i) for i, s in enumerate(SPLITS)
    ]


def test_split_weights_are_the_bytes_of_upstream_parts(spark: SparkSession, tmp_path: Path) -> None:
    _, storage = _setup(tmp_path)
    logic = SparkStageLogic(spark, storage, KEY, "b", lambda ctx: None)
    small, big = "data/a/small-n1-0000000000", "data/a/big-n1-1111111111"
    spark.range(10).write.parquet(f"file://{storage.resolve_handle(KEY, small)}")
    spark.range(100_000).write.parquet(f"file://{storage.resolve_handle(KEY, big)}")
    weights: list[Any] = logic.split_weights([small, big, "2013-01-01", "data/a/missing-n1-x"])
    assert weights[0] is not None and weights[1] is not None and weights[1] > 10 * weights[0]
    assert weights[2] is None and weights[3] is None  # not a part / not written


def test_a_stage_nobody_reads_writes_to_its_sinks_only(spark: SparkSession, tmp_path: Path) -> None:
    """``a`` (sink, read by ``b``) keeps its output parts; ``b`` (sink, no downstream stage)
    stages its batches in the sink without writing parts of its own. Transforms are told which
    batch is the stage's last."""
    from airflow_finalckpt.sinks import ParquetTableSink

    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(StageGraph.from_edges(["a", "b"], [("a", "b")]))
    last_flags: dict[str, list[bool]] = {"a": [], "b": []}

    def a(ctx: BatchContext) -> DataFrame:
        last_flags["a"].append(ctx.last_batch)
        return ctx.spark.createDataFrame([(s, 1) for s in ctx.splits], "s string, n long")

    def b(ctx: BatchContext) -> DataFrame:
        last_flags["b"].append(ctx.last_batch)
        return ctx.read_parts().withColumn("n", F.col("n") * 2)

    sinks = {sid: ParquetTableSink(f"{sid}_out", str(tmp_path / f"{sid}_out")) for sid in "ab"}
    manifests: dict[str, list[str]] = {}
    for sid, transform, splits in (("a", a, SPLITS), ("b", b, None)):
        logic = SparkStageLogic(
            spark,
            storage,
            KEY,
            sid,
            transform,
            sinks=[sinks[sid]],
            upstream_manifests=manifests,
        )
        spec = StageSpec(
            pipeline_key=KEY, stage_id=sid, splits=tuple(splits or manifests["a"]), batch_size=2
        )
        runner = StageRunner(coord, spec, logic, [sinks[sid]], output_handle=logic.output_handle)
        runner.run()
        eod = runner.try_close()
        for _ in range(100):
            if eod is not None:
                break
            coord.ensure_final_checkpoint(sid)
            eod = runner.try_close()
        assert eod is not None
        manifests[sid] = list(eod.manifest)

    assert len(manifests["a"]) == 2  # two batches of two splits, one part each
    assert manifests["b"] == []
    assert not (Path(storage.pipeline_dir(KEY)) / "data" / "b").exists()
    assert last_flags == {"a": [False, True], "b": [True]}
    a_rows = sorted(map(tuple, sinks["a"].read_pandas()[["s", "n"]].values.tolist()))
    b_rows = sorted(map(tuple, sinks["b"].read_pandas()[["s", "n"]].values.tolist()))
    assert a_rows == [(s, 1) for s in SPLITS]
    assert b_rows == [(s, 2) for s in SPLITS]


def _jobs(spark: SparkSession, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_parts_of_a_stage_are_read_with_the_schema_of_the_first_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Only the attempt's first read of a stage's parts infers their schema (a Spark job that
    reads Parquet footers); later batches give Spark that schema and start no job to read."""
    _, storage = _setup(tmp_path)
    parts = [f"data/a/p{i}-n1-{i:010d}" for i in range(3)]
    for i, part in enumerate(parts):
        frame = spark.range(i * 10, i * 10 + 10).withColumn("day", F.lit(f"d{i}"))
        frame.write.parquet(f"file://{storage.resolve_handle(KEY, part)}")
    logic = SparkStageLogic(spark, storage, KEY, "b", lambda ctx: None)
    sc = spark.sparkContext
    try:
        sc.setJobGroup("first-read", "first read")
        first = logic.read_parts(parts[:1])
        assert _jobs(spark, "first-read") >= 1  # footers read: the schema is inferred
        sc.setJobGroup("later-reads", "later reads")
        later = logic.read_parts(parts[1:])
        assert _jobs(spark, "later-reads") == 0
    finally:
        sc.setJobGroup("rest", "rest")
    assert later.schema == first.schema
    assert sorted(r.id for r in later.collect()) == list(range(10, 30))
    # another logic (a new attempt) infers again
    again = SparkStageLogic(spark, storage, KEY, "b", lambda ctx: None)
    sc.setJobGroup("new-attempt", "new attempt")
    try:
        again.read_parts(parts[2:])
        assert _jobs(spark, "new-attempt") >= 1
    finally:
        sc.setJobGroup("rest", "rest")


def test_a_broadcast_table_is_held_on_the_driver_from_the_second_batch_of_an_attempt(
    spark: SparkSession, tmp_path: Path
) -> None:
    """First batch: the factory's frame as it is (a one-batch stage pays nothing more); second:
    a driver-local copy (one collect); later batches reuse it and scan no file."""
    _, storage = _setup(tmp_path)
    path = tmp_path / "dim"
    spark.range(50).withColumn("name", F.concat(F.lit("n"), F.col("id"))).write.parquet(str(path))
    built: list[int] = []

    def factory() -> DataFrame:
        built.append(1)
        return spark.read.parquet(str(path))

    logic = SparkStageLogic(spark, storage, KEY, "b", lambda ctx: None)

    def ctx() -> BatchContext:
        return BatchContext(spark, "b", (), None, logic=logic)

    def plan_of(frame: DataFrame) -> str:
        return str(frame._jdf.queryExecution().optimizedPlan().getClass().getSimpleName())

    first = ctx().broadcast_table("dim", factory)
    assert plan_of(first) != "LocalRelation"
    second = ctx().broadcast_table("dim", factory)
    assert plan_of(second) == "LocalRelation"
    assert second.schema == first.schema
    assert sorted(map(tuple, second.collect())) == sorted(map(tuple, first.collect()))
    sc = spark.sparkContext
    sc.setJobGroup("third", "third")
    try:
        third = ctx().broadcast_table("dim", factory)
        assert _jobs(spark, "third") == 0
    finally:
        sc.setJobGroup("rest", "rest")
    assert third is second and built == [1]
    # a new attempt starts over
    other = SparkStageLogic(spark, storage, KEY, "b", lambda ctx: None)
    fresh = BatchContext(spark, "b", (), None, logic=other).broadcast_table("dim", factory)
    assert plan_of(fresh) != "LocalRelation" and built == [1, 1]
