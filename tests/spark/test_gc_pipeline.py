"""Garbage collection on the example pipeline, run on real Spark without Airflow.

After a complete run, intermediate output parts go once no retained checkpoint would re-read
them, superseded window state goes, and the sinks still equal the pandas reference. After a
crash mid-``enrich``, a collection keeps everything the resumed run needs, and the resumed run
still produces equal sinks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import (
    CheckpointState,
    StageLifecycle,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.examples.nycflights13.stages import EDGES
from airflow_finalckpt.runtime.gc import KeepReason, collect_garbage
from airflow_finalckpt.runtime.runner import RunStatus
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

DAYS = first_days(3)
BATCHES = {"ingest": 1, "enrich": 1, "delay_windows": 2, "publish": 1}
INTERMEDIATE = ("ingest", "enrich", "delay_windows")
KEY = "nyc-gc"


class InjectedCrash(RuntimeError):
    pass


class Pipeline:
    def __init__(self, tmp_path: Path) -> None:
        self.inputs = str(tmp_path / "inputs")
        prepare_inputs(self.inputs, days=DAYS)
        engine = make_engine(f"sqlite:///{tmp_path}/store.db")
        ensure_schema(engine)
        self.storage = CheckpointStorage(str(tmp_path / "checkpoints"))
        self.coord = Coordinator(engine, KEY, writer=self.storage)
        self.sinks = [
            ParquetTableSink("windows_parquet", str(tmp_path / "out" / "windows")),
            SqlTableSink("windows_sql", f"sqlite:///{tmp_path}/out.db", "delay_windows"),
        ]
        self.root = Path(self.storage.pipeline_dir(KEY))

    def run(self, spark: SparkSession, **kw: object):  # type: ignore[no-untyped-def]
        return run_example_locally(
            spark,
            self.inputs,
            self.coord,
            self.storage,
            self.sinks,
            batch_sizes=BATCHES,
            **kw,  # type: ignore[arg-type]
        )

    def parts(self, stage: str) -> set[str]:
        """The output part directories of a stage on disk (relative to the pipeline dir)."""
        base = self.root / "data" / stage
        if not base.exists():
            return set()
        return {
            f"data/{stage}/{p.name}" for p in base.iterdir() if p.is_dir() and p.name != "_parts"
        }

    def frames(self, stage: str, name: str) -> set[str]:
        base = self.root / "state" / stage / name
        if not base.exists():
            return set()
        return {p.name for p in base.iterdir() if p.is_dir()}

    def assert_sinks_match_reference(self) -> None:
        expected = reference_pipeline(DAYS)
        parquet, sql = self.sinks
        for actual in (parquet.read_pandas(), sql.read_pandas()):  # type: ignore[attr-defined]
            assert_windows_match(actual, expected.windows)

    def retained_records(self):  # type: ignore[no-untyped-def]
        return [
            self.storage.read_checkpoint(str(c.metadata_path))
            for c in self.coord.checkpoints()
            if c.state is CheckpointState.COMPLETED
        ]

    def push_out_old_checkpoints(self) -> None:
        """Completed checkpoints until retention only keeps ones taken after every stage
        closed (the pipeline is done: each completes at once, no stage has to answer)."""
        for _ in range(3):
            cid = self.coord.trigger(TriggerReason.MANUAL)
            assert cid is not None
            assert self.coord.checkpoint(cid).state is CheckpointState.COMPLETED
        for record in self.retained_records():
            assert {r.status for r in record.stages.values()} == {StageStatus.FULLY_FINISHED}


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    return Pipeline(tmp_path)


def test_complete_run_then_gc_keeps_only_what_checkpoints_and_sinks_need(
    spark: SparkSession, pipeline: Pipeline
) -> None:
    run = pipeline.run(spark)
    assert all(r.status is RunStatus.FINISHED for r in run.results.values())
    views = pipeline.coord.stages()
    assert {v.lifecycle for v in views.values()} == {StageLifecycle.CLOSED}
    before = {stage: pipeline.parts(stage) for stage in INTERMEDIATE}
    assert all(before.values()), before
    # publish has sinks and no downstream stage: its batches go to the sinks only
    assert pipeline.parts("publish") == set()
    windows_state = "state_open_windows"
    # delay_windows ran batches of 2 + 1 splits: the first kept its open windows as state, the
    # last fired every window and dropped the state
    written_state = pipeline.frames("delay_windows", windows_state)
    assert len(written_state) == 1

    # All stages are CLOSED, but retention still keeps checkpoints taken while a downstream
    # stage had not finished: restoring one of them would re-read those parts.
    report = collect_garbage(pipeline.coord, pipeline.storage, grace_s=0)
    assert report.errors == ()
    records = pipeline.retained_records()
    for upstream, downstream in EDGES:
        needed = any(r.stages[downstream].status is not StageStatus.FULLY_FINISHED for r in records)
        assert pipeline.parts(upstream) == (before[upstream] if needed else set()), upstream
    assert pipeline.parts("ingest") == set()  # every retained checkpoint has enrich finished
    final_handles = views["delay_windows"].final_snapshot.state  # type: ignore[union-attr]
    assert not [h for h in final_handles if h.name == "state:open_windows"]
    # no checkpoint was taken between delay_windows' two batches (interval 60 s): nothing
    # retained references the state of its first batch
    assert pipeline.frames("delay_windows", windows_state) == set()

    pipeline.push_out_old_checkpoints()
    report = collect_garbage(pipeline.coord, pipeline.storage, grace_s=0)
    assert report.errors == () and report.bytes_freed > 0
    for stage in INTERMEDIATE:
        assert pipeline.parts(stage) == set(), stage
        # the manifests (tiny) stay: the closed stages' final snapshots name them
        assert list((pipeline.root / "data" / stage / "_parts").glob("*.json"))
    assert sorted((pipeline.root).glob("chk-*/_metadata"))  # checkpoints untouched
    pipeline.assert_sinks_match_reference()
    assert collect_garbage(pipeline.coord, pipeline.storage, grace_s=0).deleted == ()

    # a later DAG run of the same pipeline runs no Spark job and duplicates nothing
    again = pipeline.run(spark)
    assert {r.status for r in again.results.values()} == {RunStatus.CLOSED}
    pipeline.assert_sinks_match_reference()


def test_gc_after_crash_mid_enrich_keeps_what_the_resumed_run_needs(
    spark: SparkSession, pipeline: Pipeline
) -> None:
    seen = {"enrich": 0}

    def crash_in_third_enrich_batch(stage_id: str, point: str) -> None:
        if stage_id == "enrich" and point == "before-record-batch":
            seen["enrich"] += 1
            if seen["enrich"] == 3:  # its part is written, the batch is not recorded
                raise InjectedCrash("crash mid-enrich")

    with pytest.raises(InjectedCrash):
        pipeline.run(spark, fault=crash_in_third_enrich_batch)
    enrich = pipeline.coord.stage("enrich")
    assert enrich.lifecycle is StageLifecycle.RUNNING
    assert len(enrich.progress.finished_splits) == 2
    ingest_parts = pipeline.parts("ingest")
    assert len(ingest_parts) == len(DAYS)
    recorded = {
        part
        for h in enrich.progress.state
        if h.name.startswith("output:")
        for part in h.name.removeprefix("output:").split(",")
    }
    unrecorded = pipeline.parts("enrich") - recorded
    assert len(recorded) == 2 and len(unrecorded) == 1

    report = collect_garbage(pipeline.coord, pipeline.storage, grace_s=0)

    assert report.errors == ()
    assert not [p for p in report.deleted_paths if p.startswith(("data/", "state/enrich/"))]
    assert pipeline.parts("ingest") == ingest_parts  # enrich is still reading them
    referenced = report.kept_because(KeepReason.REFERENCED)
    assert all("needed by enrich (RUNNING)" in referenced[p] for p in ingest_parts)
    assert pipeline.parts("enrich") == recorded | unrecorded
    # the crashed batch's part is newer than enrich's last recorded batch: maybe in flight
    assert set(report.kept_because(KeepReason.IN_FLIGHT)) >= unrecorded
    for handle in enrich.progress.state:  # every state file enrich restores from is there
        assert (pipeline.root / handle.path).exists(), handle.path

    run = pipeline.run(spark)
    assert run.results["ingest"].status is RunStatus.CLOSED
    assert len(run.results["enrich"].processed_splits) == 1  # only the unfinished split
    pipeline.assert_sinks_match_reference()

    pipeline.push_out_old_checkpoints()
    collect_garbage(pipeline.coord, pipeline.storage, grace_s=0)
    assert all(pipeline.parts(stage) == set() for stage in INTERMEDIATE)
    pipeline.assert_sinks_match_reference()
