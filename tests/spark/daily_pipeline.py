"""A two-stage daily pipeline on the real runtime and real Spark, without Airflow: ``ingest``
reads the day's input files (one split each), ``aggregate`` runs a transform over its parts
and publishes to sinks. Shared by the plan-check tests (the daily scenario of issue 24).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.runtime.runner import (
    CommitMode,
    RunResult,
    StageRunner,
    StageSpec,
    ThroughputHints,
)
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.spark.stage import BatchContext, SparkStageLogic, spark_path
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

Transform = Callable[[BatchContext], DataFrame | None]


def write_day_files(directory: Path, day: str, files: int = 3, rows: int = 1000) -> list[str]:
    """``files`` Parquet files of ``rows`` events each on ``day``: ten keys, value = 1."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(files):
        frame = pd.DataFrame(
            {
                "event_date": [day] * rows,
                "key": [f"k{i % 10}" for i in range(rows)],
                "value": [1] * rows,
                "file": [index] * rows,
            }
        )
        path = directory / f"{day}-{index}.parquet"
        frame.to_parquet(path, index=False)
        paths.append(str(path))
    return paths


def read_files(ctx: BatchContext) -> DataFrame:
    """The ingest transform: this batch's input files (the splits are file paths)."""
    return ctx.spark.read.parquet(*[spark_path(s) for s in ctx.splits])


def run_daily(
    spark: SparkSession,
    tmp_path: Path,
    pipeline_key: str,
    files: Sequence[str],
    transform: Transform,
    sinks: Sequence[TwoPhaseCommitSink],
    *,
    hints: ThroughputHints | None = None,
    batch_size: int | str = "auto",
    split_keys: Sequence[str] = (),
    fault: Callable[[str, str], None] | None = None,
    log: object = None,
) -> dict[str, RunResult]:
    """Run both stages to CLOSED (raises what a stage raises); returns their results."""
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coordinator = Coordinator(engine, pipeline_key, writer=storage)
    coordinator.register(StageGraph.from_edges(("ingest", "aggregate"), [("ingest", "aggregate")]))
    results: dict[str, RunResult] = {}
    manifest: list[str] = []
    for stage_id, fn, splits, stage_sinks in (
        ("ingest", read_files, tuple(files), []),
        ("aggregate", transform, (), list(sinks)),
    ):
        splits = splits or tuple(manifest)
        logic = SparkStageLogic(
            spark,
            storage,
            pipeline_key,
            stage_id,
            fn,
            sinks=stage_sinks,
            upstream_manifests={"ingest": manifest} if manifest else {},
            split_keys=split_keys if stage_id == "aggregate" else (),
        )
        runner = StageRunner(
            coordinator,
            StageSpec(
                pipeline_key=pipeline_key,
                stage_id=stage_id,
                splits=splits,
                batch_size=batch_size if stage_id == "aggregate" else 1,
                split_keys=tuple(split_keys) if stage_id == "aggregate" else (),
                commit_mode=CommitMode.FINAL,
            ),
            logic,
            stage_sinks,
            output_handle=logic.output_handle,
            hints=hints,
            fault=None if fault is None else (lambda point, s=stage_id: fault(s, point)),
            log=log,  # type: ignore[arg-type]
        )
        results[stage_id] = runner.run()
        deadline = time.monotonic() + 60
        eod = runner.try_close()
        while eod is None:
            assert time.monotonic() < deadline, f"stage {stage_id} did not close"
            coordinator.ensure_final_checkpoint(stage_id)
            time.sleep(0.05)
            eod = runner.try_close()
        manifest = list(eod.manifest)
    return results
