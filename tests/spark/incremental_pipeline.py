"""A two-stage pipeline over an incremental source, run through the real runtime (no Airflow):
``read`` (a source stage whose splits are the run's claimed range of a source, each split a
Parquet file read by Spark) -> ``publish`` (its parts, committed to a Parquet sink at the final
checkpoint). One call is one scheduled run (one pipeline key); a retry calls it again with the
same key, as Airflow's retry of a task does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import EndOfData
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.runtime.runner import CommitMode, RunStatus, StageRunner, StageSpec
from airflow_finalckpt.sinks.parquet import ParquetTableSink
from airflow_finalckpt.sources.base import IncrementalSource
from airflow_finalckpt.sources.claims import claim_splits
from airflow_finalckpt.spark.stage import SparkStageLogic
from airflow_finalckpt.storage import CheckpointStorage

Fault = Callable[[str, str], None]


class InjectedCrash(RuntimeError):
    """A crash injected at a named point (stands for a SIGKILL there)."""


@dataclass
class IncrementalEnv:
    engine: object
    storage: CheckpointStorage
    sink: ParquetTableSink
    source: IncrementalSource
    dag_id: str = "incremental"
    read_batch_size: int | str = 1
    results: dict[str, dict[str, RunStatus]] = field(default_factory=dict)


def _fault_of(fault: Fault | None, stage_id: str) -> Callable[[str], None] | None:
    return None if fault is None else (lambda point: fault(stage_id, point))


def run_pipeline(
    spark: SparkSession,
    env: IncrementalEnv,
    key: str,
    *,
    fault: Fault | None = None,
    logical_date: str | None = None,
    before_publish: Callable[[Coordinator], None] | None = None,
) -> dict[str, EndOfData]:
    """Run (or continue) pipeline ``key`` to CLOSED; raises what a fault raises."""
    coordinator = Coordinator(env.engine, key, writer=env.storage)  # type: ignore[arg-type]
    coordinator.register(StageGraph.from_edges(["read", "publish"], [("read", "publish")]))
    run = RunContext.of(dag_id=env.dag_id, run_id=key, logical_date=logical_date)
    if fault is not None:
        fault("read", "claim")
    splits = claim_splits(env.engine, env.source, pipeline_key=key, stage_id="read", run=run)  # type: ignore[arg-type]
    eods: dict[str, EndOfData] = {}

    def read(ctx):  # type: ignore[no-untyped-def]
        return ctx.spark.read.parquet(*ctx.splits)

    def publish(ctx):  # type: ignore[no-untyped-def]
        return ctx.read_parts()

    stages = [
        ("read", read, tuple(splits), [], env.read_batch_size),
        ("publish", publish, None, [env.sink], "auto"),
    ]
    for stage_id, transform, stage_splits, sinks, batch_size in stages:
        if stage_splits is None:
            stage_splits = tuple(eods["read"].manifest)
            if before_publish is not None:
                before_publish(coordinator)
        manifests = {up: list(e.manifest) for up, e in eods.items()}
        logic = SparkStageLogic(
            spark,
            env.storage,
            key,
            stage_id,
            transform,
            sinks=sinks,
            upstream_manifests=manifests,
            run=run,
        )
        runner = StageRunner(
            coordinator,
            StageSpec(
                pipeline_key=key,
                stage_id=stage_id,
                splits=stage_splits,
                batch_size=batch_size,
                commit_mode=CommitMode.FINAL,
                checkpoint_interval_s=3600.0,
            ),
            logic,
            sinks,
            output_handle=logic.output_handle,
            fault=_fault_of(fault, stage_id),
        )
        result = runner.run()
        env.results.setdefault(key, {})[stage_id] = result.status
        deadline = time.monotonic() + 120
        eod = runner.try_close()
        while eod is None:
            assert time.monotonic() < deadline, f"stage {stage_id} did not close"
            coordinator.ensure_final_checkpoint(stage_id)
            time.sleep(0.05)
            eod = runner.try_close()
        eods[stage_id] = eod
        if fault is not None:
            fault(stage_id, "after-close")
    return eods


def write_rows(directory: Path, name: str, first_id: int, count: int) -> list[int]:
    """A landing file of ``count`` rows with ids from ``first_id``, written under a hidden
    name then renamed into place (as a well-behaved writer does). Returns the ids.
    """
    ids = list(range(first_id, first_id + count))
    frame = pd.DataFrame({"id": ids, "value": [i * 10 for i in ids]})
    hidden = directory / f".{name}.tmp"
    frame.to_parquet(hidden, index=False)
    hidden.rename(directory / name)
    return ids
