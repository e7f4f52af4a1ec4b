"""Coalesced eager checkpoints through the coordinator and a real store (SQLite and PostgreSQL):
simultaneous finishes share one pending checkpoint, and a stage still closes only on a
checkpoint that holds its final snapshot (the pure rule: tests/unit/test_transitions_eager.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select

from airflow_finalckpt.coordination import AckOutcome, Coordinator
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointRecord,
    CheckpointState,
    EndOfData,
    SinkTransaction,
    StageSnapshot,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine

KEY = "coalescing"


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


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = make_engine(store_url)
    yield eng
    eng.dispose()


def make(engine: Engine, stage_ids: list[str]) -> tuple[Coordinator, MemoryWriter]:
    writer = MemoryWriter()
    coord = Coordinator(engine, KEY, writer=writer)
    coord.register(StageGraph.build(Stage(sid, ()) for sid in stage_ids))
    return coord, writer


def final(sid: str, txn_id: str | None = None) -> StageSnapshot:
    txns = () if txn_id is None else (SinkTransaction(sink_id="k", txn_id=txn_id),)
    return StageSnapshot(
        finished_splits=frozenset({f"{sid}-0"}),
        end_of_data=EndOfData(manifest=[f"{sid}/p"]),
        pending_transactions=txns,
    )


def pending_ids(coord: Coordinator) -> list[int]:
    return sorted(
        c.checkpoint_id for c in coord.checkpoints() if c.state is CheckpointState.PENDING
    )


def due_rows(engine: Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(t.acks_due.c.checkpoint_id, t.acks_due.c.stage_id).where(
                t.acks_due.c.pipeline_key == KEY
            )
        ).all()
    return sorted((int(cid), str(sid)) for cid, sid in rows)


def test_simultaneous_finishes_share_one_eager_checkpoint(engine: Engine) -> None:
    finishing = [f"f{i}" for i in range(6)]
    coord, writer = make(engine, [*finishing, "busy"])
    busy = coord.start_attempt("busy").epoch
    epochs = {sid: coord.start_attempt(sid).epoch for sid in finishing}
    outcomes = [coord.finish(sid, epochs[sid], final(sid, f"{sid}-t")) for sid in finishing]
    first = outcomes[0].eager_checkpoint_id
    assert first is not None
    assert [o.threshold for o in outcomes] == [first] * len(finishing)
    assert [o.eager_checkpoint_id for o in outcomes] == [first] * len(finishing)
    assert [o.joined for o in outcomes] == [False] + [True] * (len(finishing) - 1)
    assert [o.end_of_data.finished_at_checkpoint for o in outcomes] == [first] * len(finishing)
    assert pending_ids(coord) == [first]
    assert due_rows(engine) == [(first, "busy")]  # the finishes answered it
    assert coord.checkpoint(first).acks_pending == 1
    outcome = coord.record_batch("busy", busy, finished_splits=["b-0"])
    assert outcome.completed == (first,)
    assert due_rows(engine) == []
    record = writer.records[first]
    for sid in finishing:
        assert record.stages[sid].status is StageStatus.FULLY_FINISHED
        assert [x.txn_id for x in record.stages[sid].pending_transactions] == [f"{sid}-t"]
        assert coord.closable_checkpoint(sid) == first
        assert [x.txn_id for x in coord.committable_transactions(sid)] == [f"{sid}-t"]
    assert record.stages["busy"].status is StageStatus.PARTIALLY_FINISHED
    assert len(writer.records) == 1


def test_a_stage_started_after_the_trigger_joins_it(engine: Engine) -> None:
    coord, writer = make(engine, ["a", "late", "busy"])
    busy = coord.start_attempt("busy").epoch
    a = coord.start_attempt("a").epoch
    eager = coord.finish("a", a, final("a")).eager_checkpoint_id
    assert eager is not None
    # "late" was not started when the checkpoint was planned: nobody waits for it...
    assert coord.checkpoint(eager).plan.statuses["late"] is StageStatus.NOT_STARTED
    late = coord.start_attempt("late").epoch
    coord.record_batch("late", late, finished_splits=["late-0"])
    assert coord.pending_for("late") == []
    # ...but its finish joins it with its final snapshot instead of triggering another one.
    fin = coord.finish("late", late, final("late", "late-t"))
    assert (fin.threshold, fin.eager_checkpoint_id, fin.joined) == (eager, eager, True)
    assert pending_ids(coord) == [eager]
    assert coord.checkpoint(eager).acks_pending == 1  # still waits for busy only
    assert coord.record_batch("busy", busy, finished_splits=["b-0"]).completed == (eager,)
    stage = writer.records[eager].stages["late"]
    assert stage.status is StageStatus.FULLY_FINISHED
    assert [x.txn_id for x in stage.pending_transactions] == ["late-t"]
    assert coord.closable_checkpoint("late") == eager
    assert [x.txn_id for x in coord.committable_transactions("late")] == ["late-t"]


def test_a_stage_waits_for_a_checkpoint_after_its_finish(engine: Engine) -> None:
    """A checkpoint the stage answered at a batch boundary holds its pre-finish snapshot: the
    finish triggers a new one, and the earlier one completing does not close the stage."""
    coord, writer = make(engine, ["a", "s", "busy"])
    busy = coord.start_attempt("busy").epoch
    a, s = coord.start_attempt("a").epoch, coord.start_attempt("s").epoch
    first = coord.finish("a", a, final("a")).eager_checkpoint_id
    assert first is not None
    assert coord.record_batch("s", s, finished_splits=["s-0"]).acked == (first,)
    fin = coord.finish("s", s, final("s", "s-t"))
    assert fin.threshold == fin.eager_checkpoint_id
    assert fin.threshold > first
    assert pending_ids(coord) == [first, fin.threshold]
    # busy answers both; the first completes, then the second.
    assert coord.record_batch("busy", busy, finished_splits=["b-0"]).completed == (
        first,
        fin.threshold,
    )
    assert writer.records[first].stages["s"].status is StageStatus.PARTIALLY_FINISHED
    assert writer.records[fin.threshold].stages["s"].status is StageStatus.FULLY_FINISHED
    assert coord.closable_checkpoint("s") == fin.threshold


def test_no_join_before_a_checkpoint_the_stage_answered(engine: Engine) -> None:
    """Eager 1 planned "x" as not started; x answered periodic 2 at a batch boundary: joining
    1 would let x close on 2 without its final state, so its finish triggers 3."""
    coord, writer = make(engine, ["a", "x", "busy"])
    busy = coord.start_attempt("busy").epoch
    a = coord.start_attempt("a").epoch
    eager = coord.finish("a", a, final("a")).eager_checkpoint_id
    x = coord.start_attempt("x").epoch
    periodic = coord.trigger(TriggerReason.MANUAL)
    assert periodic is not None and eager is not None and periodic > eager
    assert coord.record_batch("x", x, finished_splits=["x-0"]).acked == (periodic,)
    fin = coord.finish("x", x, final("x", "x-t"))
    assert fin.threshold > periodic
    assert coord.record_batch("busy", busy, finished_splits=["b-0"]).completed == (
        eager,
        periodic,
        fin.threshold,
    )
    assert writer.records[periodic].stages["x"].status is StageStatus.PARTIALLY_FINISHED
    assert writer.records[fin.threshold].stages["x"].status is StageStatus.FULLY_FINISHED
    assert coord.closable_checkpoint("x") == fin.threshold


def test_a_joined_finish_acknowledges_once(engine: Engine) -> None:
    coord, _ = make(engine, ["a", "b", "busy"])
    coord.start_attempt("busy")
    a, b = coord.start_attempt("a").epoch, coord.start_attempt("b").epoch
    eager = coord.finish("a", a, final("a")).eager_checkpoint_id
    assert eager is not None
    coord.finish("b", b, final("b"))
    # finish is idempotent per attempt, and the acknowledgement is not repeated
    again = coord.finish("b", b, final("b"))
    assert again.threshold == eager
    assert coord.acknowledge(eager, "b", b) is AckOutcome.DUPLICATE
    assert coord.checkpoint(eager).acks_pending == 1


def test_a_stage_the_pending_checkpoint_does_not_plan_triggers_its_own(engine: Engine) -> None:
    """A changed DAG continues the pipeline with a new stage while eager checkpoint 1 (planned
    without it) is pending: the new stage's finish cannot join 1, it triggers 2."""
    coord, writer = make(engine, ["a", "busy"])
    busy = coord.start_attempt("busy").epoch
    a = coord.start_attempt("a").epoch
    first = coord.finish("a", a, final("a")).eager_checkpoint_id
    assert first is not None
    coord.start_pipeline(StageGraph.build(Stage(sid, ()) for sid in ["a", "busy", "new"]))
    assert "new" not in coord.checkpoint(first).plan.statuses
    new = coord.start_attempt("new").epoch
    fin = coord.finish("new", new, final("new", "new-t"))
    assert fin.threshold == fin.eager_checkpoint_id
    assert fin.threshold > first
    assert coord.record_batch("busy", busy, finished_splits=["b-0"]).completed == (
        first,
        fin.threshold,
    )
    assert "new" not in writer.records[first].stages
    assert writer.records[fin.threshold].stages["new"].status is StageStatus.FULLY_FINISHED
    assert coord.closable_checkpoint("new") == fin.threshold
