"""A stage's first run with no throughput hint, on real Spark: no probe where none is needed.

``enrich``'s splits are ingest's output parts, whose bytes are known before it runs: with the
default target a small input runs as one batch; with a tiny target the same input still splits.
Ingest's splits are day ids; it declares their bytes (``split_bytes``: its day files' sizes), so
a cold run of a small input is one batch per stage, like a warm one, and a big declared input
starts with a batch near the target.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.batching import DEFAULT_COLD_BYTES_PER_S, DEFAULT_TARGET_BATCH_S
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.runtime.runner import Batch, BatchOutput, RunStatus
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.spark.stage import SparkStageLogic
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
    spark: SparkSession,
    inputs: str,
    tmp_path: Path,
    target: dict[str, float] | None,
    batch_sizes: dict[str, int | str] | None = None,
    ingest_split_bytes: dict[str, int | None] | None = None,
) -> Counter[str]:
    """Batches per stage of a run with no hints, checked against the reference pipeline."""
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
        batch_sizes=batch_sizes,
        target_batch_s=target,
        fault=count,
        ingest_split_bytes=ingest_split_bytes,
    )
    assert all(r.status is RunStatus.FINISHED for r in run.results.values())
    assert len(run.results["ingest"].processed_splits) == len(DAYS)
    assert_windows_match(sink.read_pandas(), reference_pipeline(DAYS).windows)
    return batches


def test_a_cold_multi_split_stage_with_small_input_runs_one_batch(
    spark: SparkSession, inputs: str, tmp_path: Path
) -> None:
    batches = _cold_run(spark, inputs, tmp_path, None, {"ingest": 1})
    assert batches["ingest"] == len(DAYS)  # fixed batch_size=1: one part per day
    assert batches["enrich"] == 1  # 2 parts of a few KB: no probe, one batch


def test_a_cold_stage_whose_input_exceeds_a_tiny_target_still_splits(
    spark: SparkSession, inputs: str, tmp_path: Path
) -> None:
    batches = _cold_run(spark, inputs, tmp_path, {"enrich": 1e-6}, {"ingest": 1})
    assert batches["enrich"] == len(DAYS)  # 1 µs buys ~1 byte: every part a batch of its own


def test_a_cold_run_of_a_small_input_is_one_batch_per_stage(
    spark: SparkSession, inputs: str, tmp_path: Path
) -> None:
    """Auto everywhere, no hints: ingest sizes itself from its day files (no probe), so every
    stage runs one batch, as its warm runs do.
    """
    batches = _cold_run(spark, inputs, tmp_path, None)
    assert batches == Counter({"ingest": 1, "enrich": 1, "delay_windows": 1, "publish": 1})


def test_a_cold_source_with_a_big_declared_input_starts_near_the_target(
    spark: SparkSession, inputs: str, tmp_path: Path
) -> None:
    """Ingest declares 0.4 target-budgets per day: its first batch takes two days (0.8 of the
    budget; three would overshoot it), not a one-day probe, and the rest follow measured.
    """
    per_day = int(0.4 * DEFAULT_TARGET_BATCH_S * DEFAULT_COLD_BYTES_PER_S)
    first: list[int] = []
    original = SparkStageLogic.process

    def spy(self: SparkStageLogic, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        if self.stage_id == "ingest" and not first:
            first.append(len(batch.splits))
        return original(self, batch, txn_ids)

    many = first_days(4)
    root = tmp_path / "four-days"
    prepare_inputs(root, days=many)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SparkStageLogic, "process", spy)
        engine = make_engine(f"sqlite:///{tmp_path}/store.db")
        ensure_schema(engine)
        storage = CheckpointStorage(str(tmp_path / "checkpoints"))
        sink = ParquetTableSink("windows_parquet", str(tmp_path / "out"))
        run = run_example_locally(
            spark,
            str(root),
            Coordinator(engine, "cold-big", writer=storage),
            storage,
            [sink],
            ingest_split_bytes={day.isoformat(): per_day for day in many},
        )
    assert first == [2]
    assert len(run.results["ingest"].processed_splits) == len(many)
    assert_windows_match(sink.read_pandas(), reference_pipeline(many).windows)
