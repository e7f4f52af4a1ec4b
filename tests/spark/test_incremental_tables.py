"""Iceberg and Delta tables as incremental sources through the real runtime on real Spark: a
writer appends between and during runs, runs crash in the source, between the sink's commit
and the cursor's advance, and after it; every appended row is published exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_finalckpt.sinks.parquet import ParquetTableSink
from airflow_finalckpt.sources import DeltaAppends, IcebergAppends
from airflow_finalckpt.sources.base import IncrementalSource
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from tests.extras import import_extra
from tests.spark.incremental_pipeline import IncrementalEnv, InjectedCrash, run_pipeline

import_extra("pyiceberg", "lakehouse")
import_extra("deltalake", "lakehouse")

CRASHES = {1: ("read", "mid-batch"), 2: ("publish", "mid-commit"), 3: ("publish", "after-close")}


def rows(first: int, count: int) -> pa.Table:
    ids = list(range(first, first + count))
    return pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array([i * 10 for i in ids])})


def _iceberg(tmp_path: Path) -> tuple[IncrementalSource, Callable[[pa.Table], None]]:
    from pyiceberg.catalog import load_catalog

    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    catalog = load_catalog(
        "finalckpt", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=str(warehouse)
    )
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.events", schema=rows(0, 1).schema)
    return IcebergAppends("ns.events", warehouse=str(warehouse)), table.append


def _delta(tmp_path: Path) -> tuple[IncrementalSource, Callable[[pa.Table], None]]:
    from deltalake import write_deltalake

    uri = str(tmp_path / "delta")
    return DeltaAppends(uri), lambda t: write_deltalake(uri, t, mode="append")


@pytest.mark.parametrize("make", [_iceberg, _delta], ids=["iceberg", "delta"])
def test_appends_are_published_exactly_once_across_crashes(
    spark: SparkSession,
    tmp_path: Path,
    make: Callable[..., tuple[IncrementalSource, Callable[[pa.Table], None]]],
) -> None:
    source, append = make(tmp_path)
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    env = IncrementalEnv(
        engine=engine,
        storage=CheckpointStorage(str(tmp_path / "checkpoints")),
        sink=ParquetTableSink("out", str(tmp_path / "out")),
        source=source,
        dag_id=f"tables-{source.kind}",
    )
    written: list[int] = []
    next_id = 0
    for index in range(5):
        for _ in range(2):
            append(rows(next_id, 4))
            written += list(range(next_id, next_id + 4))
            next_id += 4
        fired: set[str] = set()

        def fault(stage: str, point: str, index: int = index, fired: set[str] = fired) -> None:
            nonlocal next_id, written
            if stage == "read" and point == "before-batch" and "late" not in fired:
                fired.add("late")  # a snapshot/version committed during the run
                append(rows(next_id, 2))
                written += [next_id, next_id + 1]
                next_id += 2
            if CRASHES.get(index) == (stage, point) and "crash" not in fired:
                fired.add("crash")
                raise InjectedCrash(f"run {index}: {stage}/{point}")

        try:
            run_pipeline(spark, env, f"run-{index}", fault=fault)
        except InjectedCrash:
            run_pipeline(spark, env, f"run-{index}", fault=fault)
    run_pipeline(spark, env, "run-last")
    published = env.sink.read_pandas()
    assert sorted(published["id"].tolist()) == sorted(written)
    assert (published["value"] == published["id"] * 10).all()
