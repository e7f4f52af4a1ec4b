"""A stage whose attempt is gone never holds a checkpoint hostage, through the coordinator and a
real store (SQLite and PostgreSQL): a failed attempt (released) or one whose lease expired (a
SIGKILLed worker) is recorded from its last durable batch boundary, pending and new checkpoints
complete without it, its sibling closes, and its next attempt continues from that snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointRecord,
    CheckpointState,
    EndOfData,
    SinkTransaction,
    StageSnapshot,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.store.engine import make_engine

KEY = "attempt-gone"
LEASE_S = 10.0


class MemoryWriter:
    """Checkpoint storage in memory: the records each completion wrote."""

    def __init__(self) -> None:
        self.records: dict[int, CheckpointRecord] = {}

    def write_checkpoint(
        self, record: CheckpointRecord, *, replace_orphan: bool = False
    ) -> tuple[str, int]:
        self.records[record.checkpoint_id] = record
        return f"memory://chk-{record.checkpoint_id}/_metadata", 1

    def discard_checkpoint(self, metadata_path: str) -> None:
        del metadata_path


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = make_engine(store_url)
    yield eng
    eng.dispose()


def txn(txn_id: str) -> SinkTransaction:
    return SinkTransaction(sink_id="k", txn_id=txn_id)


def setup(engine: Engine) -> tuple[Coordinator, MemoryWriter, Clock, int]:
    """x finished while y runs (one batch recorded, transaction y-t1): x's eager checkpoint
    waits for y. Returns the coordinator, its writer, its clock and y's epoch.
    """
    writer, clock = MemoryWriter(), Clock()
    coord = Coordinator(engine, KEY, writer=writer, clock=clock)
    coord.register(StageGraph.from_edges(["x", "y"], []))
    y = coord.start_attempt("y").epoch
    assert coord.renew_lease("y", y, LEASE_S)
    coord.record_batch("y", y, finished_splits=["y0"], transactions=[txn("y-t1")])
    x = coord.start_attempt("x").epoch
    outcome = coord.finish("x", x, StageSnapshot(end_of_data=EndOfData(manifest=["x/p"])))
    assert outcome.eager_checkpoint_id == 1
    assert coord.checkpoint(1).state is CheckpointState.PENDING
    return coord, writer, clock, y


def test_a_released_attempt_is_recorded_from_its_last_boundary_and_its_retry_continues(
    engine: Engine,
) -> None:
    coord, writer, _, y = setup(engine)
    assert coord.release_attempt("y", y) == ("y",)
    assert coord.checkpoint(1).state is CheckpointState.COMPLETED
    stage_y = writer.records[1].stages["y"]
    assert stage_y.status is StageStatus.PARTIALLY_FINISHED
    assert stage_y.finished_splits == frozenset({"y0"})
    assert [t.txn_id for t in stage_y.pending_transactions] == ["y-t1"]
    assert coord.closable_checkpoint("x") == 1
    coord.close("x", coord.stage("x").epoch, 1)
    # a new checkpoint does not wait for the gone attempt either: it completes at once
    assert coord.trigger(TriggerReason.PERIODIC) == 2
    assert coord.checkpoint(2).state is CheckpointState.COMPLETED
    # the retry continues from the snapshot; its epoch fences the gone attempt
    retry = coord.start_attempt("y")
    assert retry.epoch == y + 1 and retry.progress.finished_splits == frozenset({"y0"})
    assert coord.release_attempt("y", y) == ()  # the old attempt's late release: nothing
    assert coord.trigger(TriggerReason.PERIODIC) == 3
    assert coord.checkpoint(3).state is CheckpointState.PENDING  # the retry is alive
    coord.record_batch("y", retry.epoch, finished_splits=["y1"], transactions=[txn("y-t2")])
    assert coord.checkpoint(3).state is CheckpointState.COMPLETED
    assert writer.records[3].stages["y"].finished_splits == frozenset({"y0", "y1"})


def test_an_expired_lease_stops_blocking_after_the_lease_and_a_late_batch_is_safe(
    engine: Engine,
) -> None:
    """A SIGKILLed worker runs no code: its lease expires. Before the lease ends the
    checkpoint waits (the attempt may be mid-batch); after it, the finished stage's wait (its
    trigger's ensure_final_checkpoint) completes the checkpoint. An attempt that was only slow
    (same epoch) may still record its batch: the checkpoint holds the earlier snapshot, the
    next one covers the new transaction, nothing is lost or committed twice.
    """
    coord, writer, clock, y = setup(engine)
    clock.now += LEASE_S - 1
    assert not coord.waiting_snapshot().final_checkpoint_work("x", clock.now)
    coord.ensure_final_checkpoint("x")
    assert coord.checkpoint(1).state is CheckpointState.PENDING
    clock.now += 1
    snapshot = coord.waiting_snapshot()
    assert snapshot.gone_awaited(clock.now) == ("y",)
    assert snapshot.final_checkpoint_work("x", clock.now)
    assert not snapshot.final_checkpoint_idle("x", coord.stage("x").epoch, clock.now)
    coord.ensure_final_checkpoint("x")
    assert coord.checkpoint(1).state is CheckpointState.COMPLETED
    assert coord.closable_checkpoint("x") == 1
    assert coord.waiting_snapshot().gone_awaited(clock.now) == ()  # answered: not awaited
    # the slow attempt comes back: its batch is recorded, the next checkpoint covers it
    coord.record_batch("y", y, finished_splits=["y1"], transactions=[txn("y-t2")])
    assert coord.renew_lease("y", y, LEASE_S)
    assert coord.trigger(TriggerReason.PERIODIC) == 2
    assert coord.checkpoint(2).state is CheckpointState.PENDING  # alive again: it must answer
    coord.record_batch("y", y, finished_splits=["y2"])
    assert coord.checkpoint(2).state is CheckpointState.COMPLETED
    stamps = {t.txn_id: t.checkpoint_id for t, _ in coord.transactions("y")}
    assert stamps == {"y-t1": 1, "y-t2": 2}
    assert [t.txn_id for t in writer.records[1].stages["y"].pending_transactions] == ["y-t1"]


def test_an_attempt_without_a_lease_is_waited_for_as_before(engine: Engine) -> None:
    """No lease (an older version's attempt): the checkpoint waits for it, however long."""
    writer, clock = MemoryWriter(), Clock()
    coord = Coordinator(engine, KEY, writer=writer, clock=clock)
    coord.register(StageGraph.from_edges(["x", "y"], []))
    coord.start_attempt("y")
    x = coord.start_attempt("x").epoch
    coord.finish("x", x, StageSnapshot(end_of_data=EndOfData(manifest=[])))
    clock.now += 10 * LEASE_S
    coord.ensure_final_checkpoint("x")
    assert coord.checkpoint(1).state is CheckpointState.PENDING
