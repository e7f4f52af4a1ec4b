"""A stage's first run with no throughput hint, on real Spark: no probe where none is needed.

``enrich``'s splits are ingest's output parts, whose bytes are known before it runs: with the
default target a small input runs as one batch; with a tiny target the same input still splits.
Ingest's splits are day ids of unknown size: its cold auto run still starts with a probe.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.runtime.runner import RunStatus
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

DAYS = first_days(2)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("cold-inputs")
    prepare_inputs(root, days=DAYS)
    return str(root)


def _cold_run(
    spark: SparkSession, inputs: str, tmp_path: Path, target: dict[str, float] | None
) -> Counter[str]:
    """Batches per stage of a run with no hints (ingest: one day per batch, so one part per day)."""
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    sink = ParquetTableSink("windows_parquet", str(tmp_path / "out"))
    batches: Counter[str] = Counter()

    def count(stage_id: str, point: str) -> None:
        if point == "before-record-batch":
            batches[stage_id] += 1

    run = run_example_locally(
        spark,
        inputs,
        Coordinator(engine, "cold", writer=storage),
        storage,
        [sink],
        batch_sizes={"ingest": 1},
        target_batch_s=target,
        fault=count,
    )
    assert all(r.status is RunStatus.FINISHED for r in run.results.values())
    assert len(run.results["enrich"].processed_splits) == len(DAYS)
    assert_windows_match(sink.read_pandas(), reference_pipeline(DAYS).windows)
    return batches


def test_a_cold_multi_split_stage_with_small_input_runs_one_batch(
    spark: SparkSession, inputs: str, tmp_path: Path
) -> None:
    batches = _cold_run(spark, inputs, tmp_path, None)
    assert batches["ingest"] == len(DAYS)  # fixed batch_size=1: one part per day
    assert batches["enrich"] == 1  # 2 parts of a few KB: no probe, one batch


def test_a_cold_stage_whose_input_exceeds_a_tiny_target_still_splits(
    spark: SparkSession, inputs: str, tmp_path: Path
) -> None:
    batches = _cold_run(spark, inputs, tmp_path, {"enrich": 1e-6})
    assert batches["enrich"] == len(DAYS)  # 1 µs buys ~1 byte: every part a batch of its own
