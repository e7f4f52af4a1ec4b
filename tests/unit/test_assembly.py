"""The one assembly point of a stage attempt and the closer of a finished stage: a SQLite
coordinator, local checkpoint storage, a fake stage logic and an in-memory sink."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import SinkTransaction, StageLifecycle, StateHandle
from airflow_finalckpt.runtime.assembly import StageCode, StageJob, assemble_runner
from airflow_finalckpt.runtime.runner import (
    Batch,
    BatchOutput,
    RunStatus,
    StageCloser,
    StageLogic,
    StageSpec,
)
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink
from airflow_finalckpt.spark.job import DriverJob
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.storage.hints import StorageThroughputHints
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "assembly"


class MemorySink(TwoPhaseCommitSink):
    """Transactions as sets: staged, committed, aborted."""

    def __init__(self, sink_id: str = "out") -> None:
        super().__init__(sink_id)
        self.staged: set[str] = set()
        self.committed: set[str] = set()
        self.aborted: set[str] = set()

    def staging_location(self, txn_id: str) -> str:
        return f"memory://{txn_id}"

    def write_pandas(self, txn_id: str, frame: Any) -> None:
        self.staged.add(txn_id)

    def write_spark(self, txn_id: str, df: Any) -> None:
        self.staged.add(txn_id)

    def precommit(self, txn_id: str, checkpoint_id: int) -> SinkTransaction:
        self.staged.add(txn_id)
        return SinkTransaction(sink_id=self.sink_id, txn_id=txn_id, checkpoint_id=checkpoint_id)

    def commit(self, txn: SinkTransaction) -> bool:
        new = txn.txn_id not in self.committed
        self.committed.add(txn.txn_id)
        self.staged.discard(txn.txn_id)
        return new

    def abort(self, txn: SinkTransaction) -> None:
        self.aborted.add(txn.txn_id)
        self.staged.discard(txn.txn_id)

    def is_committed(self, txn_id: str) -> bool:
        return txn_id in self.committed

    def committed_txn_ids(self) -> set[str]:
        return set(self.committed)

    def staged_txn_ids(self) -> set[str]:
        return set(self.staged)


class Logic:
    """Does nothing per batch; remembers what it was built from."""

    def __init__(self, job: StageJob, code: StageCode, storage: CheckpointStorage) -> None:
        self.job, self.code, self.storage = job, code, storage

    def output_handle(self, batch: Batch, parts: Sequence[str]) -> StateHandle:
        raise AssertionError("no parts are written")

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        pass

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        return BatchOutput()


def make_logic(job: StageJob, code: StageCode, storage: CheckpointStorage) -> StageLogic:
    return Logic(job, code, storage)


@pytest.fixture
def env(tmp_path: Path) -> tuple[Coordinator, CheckpointStorage]:
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, KEY, writer=storage)
    coord.register(StageGraph.from_edges(["a"], []))
    return coord, storage


def _job(hints_scope: str | None = "dag-demo") -> StageJob:
    spec = StageSpec(pipeline_key=KEY, stage_id="a", splits=("s1", "s2", "s3"), batch_size=2)
    return StageJob(spec, upstream_manifests={"up": ["data/up/p1"]}, hints_scope=hints_scope)


def test_the_runner_is_built_from_the_plain_values(env: tuple) -> None:
    coord, storage = env
    sink = MemorySink()
    job, code = _job(), StageCode(transform=print, sinks=(sink,))

    runner = assemble_runner(coord, storage, job, code, make_logic)

    assert isinstance(runner.logic, Logic)
    assert (runner.logic.job, runner.logic.code, runner.logic.storage) == (job, code, storage)
    assert runner.spec is job.spec and runner.sinks == {"out": sink}
    assert runner.output_handle == runner.logic.output_handle
    assert isinstance(runner.hints, StorageThroughputHints)
    assert assemble_runner(coord, storage, _job(None), code, make_logic).hints is None


def test_the_closer_commits_and_closes_a_finished_stage_without_its_logic(env: tuple) -> None:
    coord, storage = env
    sink = MemorySink()
    runner = assemble_runner(coord, storage, _job(), StageCode(sinks=(sink,)), make_logic)
    result = runner.run()
    assert result.status is RunStatus.FINISHED and runner.epoch is not None

    # what the operator does back from the triggerer: a new sink object, no stage logic
    closer = StageCloser(coord, "a", [sink], epoch=runner.epoch)
    eod = closer.try_close()

    assert eod is not None and eod == result.end_of_data
    assert coord.stage("a").lifecycle is StageLifecycle.CLOSED
    assert sink.committed and not sink.staged and not sink.aborted
    # closing again is a no-op that re-publishes the same end_of_data
    assert StageCloser(coord, "a", [sink]).try_close() == eod


def test_the_runner_closes_through_its_closer(env: tuple) -> None:
    coord, storage = env
    runner = assemble_runner(coord, storage, _job(), StageCode(), make_logic)
    runner.run()
    closer = runner.closer()

    assert (closer.stage_id, closer.epoch, closer.gc_source) == ("a", runner.epoch, runner.logic)
    assert runner.try_close() is not None
    assert coord.stage("a").lifecycle is StageLifecycle.CLOSED


def test_a_submitted_driver_assembles_from_the_same_values() -> None:
    job = _job()
    spec = DriverJob.for_stage(
        job,
        submission_id="sub-1",
        storage_uri="/checkpoints",
        store_url_masked="sqlite://",
        code={"transform": "ref:mod:fn"},
        spark_conf={},
    )

    assert DriverJob.from_json(spec.to_json()).stage_job() == job
