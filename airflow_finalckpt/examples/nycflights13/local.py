"""Run the example pipeline without Airflow: one stage after the other, in this process.

Used by tests and benchmarks to exercise the runtime on real Spark. Airflow runs the same stages
as tasks (see ``dags/nycflights13_pipeline.py``), where waiting for the final checkpoint is
deferred to the triggerer instead of polled here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.batching import DEFAULT_TARGET_BATCH_S
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import EndOfData
from airflow_finalckpt.core.split_bytes import SplitBytes
from airflow_finalckpt.examples.nycflights13.data import open_layout
from airflow_finalckpt.examples.nycflights13.stages import (
    EDGES,
    STAGE_IDS,
    ExampleStage,
    example_stages,
)
from airflow_finalckpt.runtime.runner import (
    CommitMode,
    RunResult,
    RunStatus,
    StageRunner,
    StageSpec,
    ThroughputHints,
)
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.spark.stage import SparkStageLogic
from airflow_finalckpt.storage import CheckpointStorage

log = logging.getLogger(__name__)


@dataclass
class LocalRun:
    """What a local run of the example produced: each stage's result and end-of-data record."""

    results: dict[str, RunResult] = field(default_factory=dict)
    end_of_data: dict[str, EndOfData] = field(default_factory=dict)


def _stage_fault(
    fault: Callable[[str, str], None] | None, stage_id: str
) -> Callable[[str], None] | None:
    if fault is None:
        return None
    return lambda point: fault(stage_id, point)


def example_graph() -> StageGraph:
    """The example's four stages: ingest -> enrich -> delay_windows -> publish."""
    return StageGraph.from_edges(STAGE_IDS, EDGES)


def run_example_locally(
    spark: SparkSession,
    input_dir: str,
    coordinator: Coordinator,
    storage: CheckpointStorage,
    sinks: Sequence[TwoPhaseCommitSink],
    *,
    batch_sizes: Mapping[str, int | str] | None = None,
    target_batch_s: float | Mapping[str, float] | None = None,
    hints: ThroughputHints | None = None,
    commit_mode: CommitMode = CommitMode.PROGRESSIVE,
    checkpoint_interval_s: float = 60.0,
    fault: Callable[[str, str], None] | None = None,
    close_timeout_s: float = 60.0,
    ingest_split_bytes: SplitBytes | None = None,
) -> LocalRun:
    """Run every stage to CLOSED (raises whatever a stage raises, e.g. an injected fault).

    ``batch_sizes``: per stage, ``"auto"`` (default) or a split count; ``target_batch_s``: the
    auto batches' target seconds, for every stage or per stage (default: the runtime's);
    ``hints``: where measured batch throughput is kept between runs (None: every run starts
    cold); ``ingest_split_bytes``: ingest's declared split sizes instead of its day files' (tests
    of a big cold input).
    """
    coordinator.register(example_graph())
    layout = open_layout(input_dir)
    run = LocalRun()
    for stage in example_stages(input_dir):
        if stage.primary_input is None:
            splits: tuple[str, ...] = layout.split_ids
        else:
            splits = tuple(run.end_of_data[stage.primary_input].manifest)
        manifests = {up: list(run.end_of_data[up].manifest) for up in run.end_of_data}
        stage_sinks = list(sinks) if stage.stage_id == "publish" else []
        logic = SparkStageLogic(
            spark,
            storage,
            coordinator.pipeline_key,
            stage.stage_id,
            stage.transform,
            on_finish=stage.on_finish,
            sinks=stage_sinks,
            upstream_manifests=manifests,
            split_bytes=_split_bytes_of(stage, ingest_split_bytes),
        )
        stage_id = stage.stage_id
        runner = StageRunner(
            coordinator,
            StageSpec(
                pipeline_key=coordinator.pipeline_key,
                stage_id=stage_id,
                splits=splits,
                batch_size=(batch_sizes or {}).get(stage_id, "auto"),
                target_batch_s=_target_of(target_batch_s, stage_id),
                commit_mode=commit_mode,
                checkpoint_interval_s=checkpoint_interval_s,
            ),
            logic,
            stage_sinks,
            output_handle=logic.output_handle,
            fault=_stage_fault(fault, stage_id),
            hints=hints,
        )
        result = runner.run()
        run.results[stage_id] = result
        if result.status is RunStatus.SUSPENDED:
            return run
        deadline = time.monotonic() + close_timeout_s
        eod = runner.try_close()
        while eod is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"stage {stage_id} did not reach its final checkpoint")
            coordinator.ensure_final_checkpoint(stage_id)
            time.sleep(0.05)
            eod = runner.try_close()
        run.end_of_data[stage_id] = eod
    return run


def _split_bytes_of(
    stage: ExampleStage, ingest_split_bytes: SplitBytes | None
) -> SplitBytes | None:
    """A stage's declared split sizes: the ones given for ingest, else the stage's own."""
    if stage.stage_id == "ingest" and ingest_split_bytes is not None:
        return ingest_split_bytes
    return stage.split_bytes


def _target_of(target_batch_s: float | Mapping[str, float] | None, stage_id: str) -> float:
    """A stage's auto-batch target: the one given for it, else the runtime's default."""
    if isinstance(target_batch_s, Mapping):
        return target_batch_s.get(stage_id) or DEFAULT_TARGET_BATCH_S
    return target_batch_s or DEFAULT_TARGET_BATCH_S
