"""A stage that started after a checkpoint's trigger, ran batches and was then suspended by a
later savepoint, with that checkpoint completing before the savepoint: the checkpoint must
not record splits whose sink transactions it does not hold (restoring it would skip those
splits and never commit their output). Through the real Coordinator (SQLite and PostgreSQL),
restored into a fresh store.
"""

from __future__ import annotations

from pathlib import Path

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointRecord,
    CheckpointState,
    SinkTransaction,
    StageStatus,
    StopMode,
    TriggerReason,
)
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

KEY = "late-suspended"


def txn(split: str) -> SinkTransaction:
    """The sink transaction holding one split's output (one split per batch here)."""
    return SinkTransaction(sink_id="k", txn_id=f"t-{split}")


def uncovered(record: CheckpointRecord, committed: set[str], stage_id: str) -> set[str]:
    """Finished splits of ``stage_id`` whose transaction the record neither holds as pending
    nor is already committed: restoring the record loses their output.
    """
    stage = record.stages[stage_id]
    pending = {x.txn_id for x in stage.pending_transactions}
    return {s for s in stage.finished_splits if txn(s).txn_id not in pending | committed}


def test_a_late_stage_suspended_after_the_checkpoint_loses_no_transaction(
    store_url: str, tmp_path: Path
) -> None:
    engine = make_engine(store_url)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, KEY, writer=storage)
    graph = StageGraph.from_edges(["busy", "late"], [])
    coord.register(graph)
    busy = coord.start_attempt("busy").epoch
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    assert coord.checkpoint(cid).plan.statuses["late"] is StageStatus.NOT_STARTED
    # "late" starts after the trigger and runs batches, each with its sink transaction
    late = coord.start_attempt("late").epoch
    for split in ("l-0", "l-1"):
        coord.record_batch("late", late, finished_splits=[split], transactions=[txn(split)])
    # a later savepoint: "late" answers it at its next batch boundary and suspends
    stop = coord.request_stop(StopMode.SAVEPOINT)
    savepoint = stop.savepoint_id
    assert savepoint is not None and savepoint > cid
    assert (
        savepoint
        in coord.record_batch(
            "late", late, finished_splits=["l-2"], transactions=[txn("l-2")]
        ).acked
    )
    coord.suspend("late", late)
    assert coord.stage("late").lifecycle.value == "SUSPENDED"
    # the checkpoint completes before the savepoint (busy acknowledges it alone)
    coord.acknowledge(cid, "busy", busy)
    assert coord.checkpoint(cid).state is CheckpointState.COMPLETED
    assert coord.checkpoint(savepoint).state is CheckpointState.PENDING
    path = coord.checkpoint(cid).metadata_path
    assert path is not None
    record = storage.read_checkpoint(path)
    committed = {x.txn_id for x, state in coord.transactions("late") if state == "COMMITTED"}
    assert uncovered(record, committed, "late") == set()

    # restored into a fresh store, every split it skips has its output committed or pending
    fresh = make_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    ensure_schema(fresh)
    restored = Coordinator(fresh, KEY, writer=storage)
    assert restored.start_pipeline(graph, record=record, source=path).restored is not None
    skipped = restored.stage("late").progress.finished_splits
    kept = {x.txn_id for x, _state in restored.transactions("late")}
    assert {s for s in skipped if txn(s).txn_id not in kept | committed} == set()
    # and the records say what the checkpoint holds of "late": nothing (it started after it)
    assert record.stages["late"].status is StageStatus.NOT_STARTED
    fresh.dispose()
    engine.dispose()


def test_a_restored_stage_recorded_idle_keeps_its_transactions(
    store_url: str, tmp_path: Path
) -> None:
    """The same with restored progress: planned PARTIALLY_FINISHED, the stage restarts after
    the trigger, runs a batch, answers the savepoint and suspends; the checkpoint records it
    from its idle progress, with every uncommitted transaction (the restored one included).
    """
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    graph = StageGraph.from_edges(["busy", "late"], [])
    first = make_engine(f"sqlite:///{tmp_path / 'first.db'}")
    ensure_schema(first)
    origin = Coordinator(first, KEY, writer=storage)
    origin.register(graph)
    busy0, late0 = (origin.start_attempt(s).epoch for s in ("busy", "late"))
    c0 = origin.trigger(TriggerReason.MANUAL)
    assert c0 is not None
    origin.record_batch("late", late0, finished_splits=["l-0"], transactions=[txn("l-0")])
    origin.record_batch("busy", busy0, finished_splits=["b-0"])
    path0 = origin.checkpoint(c0).metadata_path
    assert path0 is not None

    engine = make_engine(store_url)
    coord = Coordinator(engine, KEY, writer=storage)
    coord.start_pipeline(graph, record=storage.read_checkpoint(path0), source=path0)
    busy = coord.start_attempt("busy").epoch
    cid = coord.trigger(TriggerReason.MANUAL)
    assert cid is not None
    assert coord.checkpoint(cid).plan.statuses["late"] is StageStatus.PARTIALLY_FINISHED
    late = coord.start_attempt("late").epoch
    coord.record_batch("late", late, finished_splits=["l-1"], transactions=[txn("l-1")])
    savepoint = coord.request_stop(StopMode.SAVEPOINT).savepoint_id
    batch = coord.record_batch("late", late, finished_splits=["l-2"], transactions=[txn("l-2")])
    assert savepoint in batch.acked
    coord.suspend("late", late)
    coord.acknowledge(cid, "busy", busy)
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.COMPLETED and info.metadata_path is not None
    record = storage.read_checkpoint(info.metadata_path)
    committed = {x.txn_id for x, state in coord.transactions("late") if state == "COMMITTED"}
    assert record.stages["late"].finished_splits == {"l-0", "l-1", "l-2"}
    assert uncovered(record, committed, "late") == set()
    first.dispose()
    engine.dispose()
