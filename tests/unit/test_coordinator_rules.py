"""The coordinator's rules, one transition at a time, on SQLite and on PostgreSQL.

The rules themselves are tested on plain values in tests/unit/test_transitions*.py; these tests
check that the facade and the store apply them: every test drives a real coordination store
(``store_url``: a migrated SQLite file and a fresh PostgreSQL database) and checks the rows the
transitions leave behind. Timeouts use a fake clock, never sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.pool import NullPool

from airflow_finalckpt.coordination import (
    AckOutcome,
    Coordinator,
    CoordinatorOptions,
)
from airflow_finalckpt.core.errors import (
    CheckpointNotPendingError,
    DrainedSavepointError,
    IllegalTransitionError,
    StaleEpochError,
    StopRequestError,
    UnknownCheckpointError,
    UnknownPipelineError,
    UnknownStageError,
)
from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    CheckpointState,
    EndOfData,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    StageStatus,
    StopMode,
    StopState,
    TransactionState,
    TriggerReason,
)
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine

KEY = "rules-pipeline"
MANUAL = TriggerReason.MANUAL


# ---------------------------------------------------------------------------------- helpers


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingWriter:
    """A CheckpointWriter that keeps records in memory and records every call.

    ``discard_checkpoint`` looks at the checkpoint's row through an independent connection: it
    sees the DISCARDED state only if the transition that discarded it has committed.
    """

    def __init__(self, url: str) -> None:
        self.records: dict[int, CheckpointRecord] = {}
        self.discarded: list[tuple[int, str | None]] = []
        self.fail_with: str | None = None
        self._observer = create_engine(url, poolclass=NullPool)

    def write_checkpoint(
        self, record: CheckpointRecord, *, replace_orphan: bool = False
    ) -> tuple[str, int]:
        if self.fail_with is not None:
            raise OSError(self.fail_with)
        self.records[record.checkpoint_id] = record
        return f"memory://{record.pipeline_key}/chk-{record.checkpoint_id}/_metadata", 100

    def discard_checkpoint(self, metadata_path: str) -> None:
        checkpoint_id = int(metadata_path.split("/chk-")[1].split("/")[0])
        with self._observer.connect() as conn:
            state = conn.execute(
                select(t.checkpoints.c.state).where(
                    t.checkpoints.c.pipeline_key == KEY,
                    t.checkpoints.c.checkpoint_id == checkpoint_id,
                )
            ).scalar()
        self.discarded.append((checkpoint_id, state))

    def close(self) -> None:
        self._observer.dispose()


def graph_of(edges: Mapping[str, tuple[str, ...]]) -> StageGraph:
    """Stage id -> its upstream stage ids."""
    return StageGraph.build(Stage(sid, ups) for sid, ups in edges.items())


def txn(sink: str, txn_id: str) -> SinkTransaction:
    return SinkTransaction(sink_id=sink, txn_id=txn_id, payload={"rows": 1})


def eod(*, drain: bool = False) -> StageSnapshot:
    return StageSnapshot(end_of_data=EndOfData(drain=drain, manifest=["part-0"]))


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = make_engine(store_url)
    yield eng
    eng.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def writer(store_url: str) -> Iterator[RecordingWriter]:
    w = RecordingWriter(store_url)
    yield w
    w.close()


def make(
    engine: Engine,
    edges: Mapping[str, tuple[str, ...]],
    *,
    clock: FakeClock | None = None,
    writer: RecordingWriter | None = None,
    retain: int = 3,
    timeout: float = 600.0,
) -> Coordinator:
    coord = Coordinator(engine, KEY, writer=writer, clock=clock or FakeClock())
    coord.register(graph_of(edges), CoordinatorOptions(retain, timeout))
    return coord


def start(coord: Coordinator, *stage_ids: str) -> dict[str, int]:
    return {sid: coord.start_attempt(sid).epoch for sid in stage_ids}


def trig(coord: Coordinator) -> int:
    """A manual trigger that must yield a checkpoint."""
    cid = coord.trigger(MANUAL)
    assert cid is not None
    return cid


def state_of(coord: Coordinator, checkpoint_id: int) -> CheckpointState:
    return coord.checkpoint(checkpoint_id).state


def ack_rows(engine: Engine, checkpoint_id: int) -> dict[str, bool]:
    with engine.connect() as conn:
        return {
            r.stage_id: bool(r.by_finish)
            for r in conn.execute(
                select(t.acks.c.stage_id, t.acks.c.by_finish).where(
                    t.acks.c.pipeline_key == KEY, t.acks.c.checkpoint_id == checkpoint_id
                )
            )
        }


def store_rows(engine: Engine) -> dict[str, list[str]]:
    """Every row of every coordination table, for before/after comparisons."""
    with engine.connect() as conn:
        return {
            table.name: sorted(repr(tuple(r)) for r in conn.execute(select(table)))
            for table in t.metadata.sorted_tables
        }


def txn_states(coord: Coordinator, stage_id: str) -> dict[str, str]:
    return {x.txn_id: state for x, state in coord.transactions(stage_id)}


# ---------------------------------------------------------------------------------- plan


def test_plan_with_all_stages_running(engine: Engine) -> None:
    coord = make(engine, {"a": (), "b": ("a",), "c": ("b",)})
    start(coord, "a", "b", "c")
    cid = coord.trigger(MANUAL)
    assert cid == 1
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.PENDING
    assert info.plan.to_ack == ("a", "b", "c")
    assert info.plan.to_trigger == ("a",)
    assert info.plan.fully_finished == () and info.plan.not_started == ()
    assert info.acks_pending == 3
    assert coord.pending_for("b") == [cid]


def test_not_started_stages_need_no_ack(engine: Engine, writer: RecordingWriter) -> None:
    coord = make(engine, {"a": (), "b": ("a",)}, writer=writer)
    epochs = start(coord, "a")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    assert coord.checkpoint(cid).plan.to_ack == ("a",)
    assert coord.acknowledge(cid, "a", epochs["a"]) is AckOutcome.COMPLETED
    assert state_of(coord, cid) is CheckpointState.COMPLETED
    assert writer.records[cid].stages["b"].status is StageStatus.NOT_STARTED
    assert writer.records[cid].stages["a"].status is StageStatus.RUNNING


def test_checkpoint_with_nothing_to_ack_completes_at_once(engine: Engine) -> None:
    coord = make(engine, {"a": (), "b": ("a",)})
    cid = coord.trigger()
    assert cid == 1
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.COMPLETED
    assert info.acks_pending == 0 and info.plan.to_ack == ()
    assert info.completed_at is not None
    assert coord.latest_completed() == info


# ---------------------------------------------------------------------------------- acks


def test_acks_complete_the_checkpoint(engine: Engine, clock: FakeClock) -> None:
    coord = make(engine, {"a": (), "b": ()}, clock=clock)
    epochs = start(coord, "a", "b")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    assert coord.acknowledge(cid, "a", epochs["a"]) is AckOutcome.ACCEPTED
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.PENDING and info.acks_pending == 1
    clock.advance(5)
    assert coord.acknowledge(cid, "b", epochs["b"]) is AckOutcome.COMPLETED
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.COMPLETED and info.acks_pending == 0
    assert info.completed_at == clock.now
    assert ack_rows(engine, cid) == {"a": False, "b": False}


def test_duplicate_ack_changes_nothing(engine: Engine) -> None:
    coord = make(engine, {"a": (), "b": ()})
    epochs = start(coord, "a", "b")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    assert coord.acknowledge(cid, "a", epochs["a"]) is AckOutcome.ACCEPTED
    before = store_rows(engine)
    assert coord.acknowledge(cid, "a", epochs["a"]) is AckOutcome.DUPLICATE
    assert store_rows(engine) == before
    assert coord.checkpoint(cid).acks_pending == 1


def test_ack_for_a_checkpoint_that_is_not_pending(engine: Engine) -> None:
    coord = make(engine, {"a": (), "b": ()})
    epochs = start(coord, "a", "b")
    aborted = coord.trigger(MANUAL)
    assert aborted is not None
    assert coord.abort(aborted, "operator said so") is True
    assert coord.acknowledge(aborted, "a", epochs["a"]) is AckOutcome.NOT_PENDING
    done = coord.trigger(MANUAL)
    assert done is not None
    coord.acknowledge(done, "a", epochs["a"])
    coord.acknowledge(done, "b", epochs["b"])
    assert coord.acknowledge(done, "a", epochs["a"]) is AckOutcome.NOT_PENDING
    assert ack_rows(engine, aborted) == {}


def test_decline_aborts_with_the_reason(engine: Engine) -> None:
    coord = make(engine, {"a": (), "b": ()})
    epochs = start(coord, "a", "b")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    coord.decline(cid, "b", epochs["b"], "executor lost")
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.ABORTED
    assert info.failure_reason is not None
    assert "'b'" in info.failure_reason and "executor lost" in info.failure_reason
    assert info.failure_kind is CheckpointFailureReason.DECLINED
    with pytest.raises(CheckpointNotPendingError, match=rf"checkpoint {cid} is ABORTED"):
        coord.decline(cid, "a", epochs["a"], "again")
    assert coord.acknowledge(cid, "a", epochs["a"]) is AckOutcome.NOT_PENDING


def test_abort_is_reported_once(engine: Engine) -> None:
    coord = make(engine, {"a": ()})
    start(coord, "a")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    assert coord.abort(cid, "manual abort") is True
    assert coord.abort(cid, "manual abort") is False
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.ABORTED and info.failure_reason == "manual abort"
    assert info.failure_kind is CheckpointFailureReason.MANUAL


def test_timeout_with_a_fake_clock(engine: Engine, clock: FakeClock) -> None:
    coord = make(engine, {"a": ()}, clock=clock, timeout=10.0)
    epochs = start(coord, "a")
    cid = coord.trigger()
    assert cid is not None
    clock.advance(9.5)
    assert coord.expire_timed_out() == []
    assert coord.trigger() is None  # periodic: one is still pending
    clock.advance(1.0)
    assert coord.expire_timed_out() == [cid]
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.ABORTED
    assert info.failure_reason is not None and "timed out" in info.failure_reason
    assert info.failure_kind is CheckpointFailureReason.EXPIRED
    assert coord.expire_timed_out() == []
    assert coord.acknowledge(cid, "a", epochs["a"]) is AckOutcome.NOT_PENDING


def test_periodic_trigger_expires_the_timed_out_checkpoint_first(
    engine: Engine, clock: FakeClock
) -> None:
    coord = make(engine, {"a": ()}, clock=clock, timeout=10.0)
    start(coord, "a")
    first = coord.trigger()
    assert first is not None
    assert coord.trigger(MANUAL) == first + 1  # manual triggers run concurrently
    clock.advance(11)
    second = coord.trigger()
    assert second == first + 2
    assert state_of(coord, first) is CheckpointState.ABORTED
    assert state_of(coord, first + 1) is CheckpointState.ABORTED


# ---------------------------------------------------------------------------------- subsume


def test_completing_a_checkpoint_subsumes_older_pending_but_not_savepoints(
    engine: Engine,
) -> None:
    coord = make(engine, {"a": (), "b": ()})
    epochs = start(coord, "a", "b")
    ids = [
        coord.trigger(MANUAL),
        coord.trigger(MANUAL, CheckpointKind.SAVEPOINT),
        coord.trigger(MANUAL),
        coord.trigger(MANUAL),
        coord.trigger(MANUAL),
    ]
    assert ids == [1, 2, 3, 4, 5]
    coord.acknowledge(5, "a", epochs["a"])
    assert coord.acknowledge(5, "b", epochs["b"]) is AckOutcome.COMPLETED
    for cid in (1, 3, 4):
        info = coord.checkpoint(cid)
        assert info.state is CheckpointState.ABORTED, cid
        assert info.failure_reason is not None and "subsumed" in info.failure_reason
        assert "5" in info.failure_reason
        assert info.failure_kind is CheckpointFailureReason.SUBSUMED
    assert state_of(coord, 2) is CheckpointState.PENDING
    coord.acknowledge(2, "a", epochs["a"])
    assert coord.acknowledge(2, "b", epochs["b"]) is AckOutcome.COMPLETED
    assert state_of(coord, 2) is CheckpointState.COMPLETED
    assert state_of(coord, 5) is CheckpointState.COMPLETED


# ---------------------------------------------------------------------------------- retention


def test_retention_discards_old_checkpoints_after_commit(
    engine: Engine, writer: RecordingWriter
) -> None:
    coord = make(engine, {"a": ()}, writer=writer, retain=2)
    ids = [coord.trigger(MANUAL) for _ in range(3)]
    ids.append(coord.trigger(MANUAL, CheckpointKind.SAVEPOINT))
    ids += [coord.trigger(MANUAL) for _ in range(3)]
    assert ids == [1, 2, 3, 4, 5, 6, 7]
    states = {c.checkpoint_id: c.state for c in coord.checkpoints()}
    assert states == {
        1: CheckpointState.DISCARDED,
        2: CheckpointState.DISCARDED,
        3: CheckpointState.DISCARDED,
        4: CheckpointState.COMPLETED,  # savepoints are never discarded by retention
        5: CheckpointState.DISCARDED,
        6: CheckpointState.COMPLETED,
        7: CheckpointState.COMPLETED,
    }
    # Each discard ran once, after the discarding transaction committed: an independent
    # connection already saw the row DISCARDED.
    assert sorted(writer.discarded) == [(c, CheckpointState.DISCARDED.value) for c in (1, 2, 3, 5)]
    assert coord.latest_completed() is not None
    assert coord.latest_completed().checkpoint_id == 7  # type: ignore[union-attr]
    discarded = coord.checkpoint(1)
    assert discarded.is_completed and discarded.metadata_path is not None


def test_failing_checkpoint_write_aborts_it_and_the_run_goes_on(
    engine: Engine, writer: RecordingWriter
) -> None:
    coord = make(engine, {"a": (), "b": ()}, writer=writer)
    epochs = start(coord, "a", "b")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    coord.acknowledge(cid, "a", epochs["a"])
    writer.fail_with = "bucket is read-only"
    outcome = coord.acknowledge(cid, "b", epochs["b"])
    info = coord.checkpoint(cid)
    assert info.state is CheckpointState.ABORTED
    assert info.failure_reason is not None and "bucket is read-only" in info.failure_reason
    assert info.failure_kind is CheckpointFailureReason.WRITE_FAILED
    assert info.completed_at is None
    # The stage must not be told its checkpoint completed.
    assert outcome is not AckOutcome.COMPLETED
    writer.fail_with = None
    nxt = coord.trigger()
    assert nxt == cid + 1
    out_a = coord.record_batch("a", epochs["a"], finished_splits=["s1"])
    out_b = coord.record_batch("b", epochs["b"], finished_splits=["s2"])
    assert out_a.acked == (nxt,) and out_b.completed == (nxt,)
    assert state_of(coord, nxt) is CheckpointState.COMPLETED


def test_failing_write_is_not_reported_as_completed_at_a_batch_boundary(
    engine: Engine, writer: RecordingWriter
) -> None:
    coord = make(engine, {"a": ()}, writer=writer)
    epochs = start(coord, "a")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    writer.fail_with = "no space left on device"
    out = coord.record_batch("a", epochs["a"], finished_splits=["s1"])
    assert state_of(coord, cid) is CheckpointState.ABORTED
    assert cid not in out.completed


def test_failing_discard_does_not_fail_the_committed_transition(
    engine: Engine, writer: RecordingWriter
) -> None:
    coord = make(engine, {"a": ()}, writer=writer, retain=1)
    assert coord.trigger(MANUAL) == 1
    calls: list[str] = []

    def broken_discard(path: str) -> None:
        calls.append(path)
        raise OSError("permission denied")

    writer.discard_checkpoint = broken_discard  # type: ignore[method-assign,assignment]
    assert coord.trigger(MANUAL) == 2  # committed: a cleanup failure must not surface here
    assert calls == [coord.checkpoint(1).metadata_path]
    assert state_of(coord, 1) is CheckpointState.DISCARDED
    assert state_of(coord, 2) is CheckpointState.COMPLETED
    assert coord.trigger(MANUAL) == 3


# ---------------------------------------------------------------------------------- finishing


def test_stage_finishing_while_triggered_acks_by_its_finish(
    engine: Engine, writer: RecordingWriter
) -> None:
    coord = make(engine, {"a": (), "b": ()}, writer=writer)
    epochs = start(coord, "a", "b")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    coord.acknowledge(cid, "b", epochs["b"])
    assert coord.pending_for("a") == [cid]
    outcome = coord.finish("a", epochs["a"], eod())
    # No further call from a: its finish answered the checkpoint.
    assert state_of(coord, cid) is CheckpointState.COMPLETED
    assert ack_rows(engine, cid) == {"a": True, "b": False}
    record = writer.records[cid]
    assert record.stages["a"].status is StageStatus.FULLY_FINISHED
    assert record.stages["a"].end_of_data is not None
    assert record.stages["a"].state == ()
    assert record.stages["b"].status is StageStatus.RUNNING
    assert coord.pending_for("a") == []
    assert outcome.threshold == cid + 1 and outcome.eager_checkpoint_id == cid + 1


def test_finish_answers_every_checkpoint_waiting_for_the_stage(engine: Engine) -> None:
    coord = make(engine, {"a": ()})
    epochs = start(coord, "a")
    first, second = coord.trigger(MANUAL), coord.trigger(MANUAL, CheckpointKind.SAVEPOINT)
    assert first is not None and second is not None
    coord.finish("a", epochs["a"], eod())
    # Both are answered by the finish, in order, and complete: none is left hanging.
    assert state_of(coord, first) is CheckpointState.COMPLETED
    assert state_of(coord, second) is CheckpointState.COMPLETED
    assert ack_rows(engine, first) == ack_rows(engine, second) == {"a": True}
    assert not [c for c in coord.checkpoints() if c.state is CheckpointState.PENDING]


def test_finish_is_idempotent_per_attempt(engine: Engine) -> None:
    coord = make(engine, {"a": (), "b": ()})
    epochs = start(coord, "a", "b")
    first = coord.finish("a", epochs["a"], eod())
    before = store_rows(engine)
    again = coord.finish("a", epochs["a"], eod())
    assert again.threshold == first.threshold and again.eager_checkpoint_id is None
    assert store_rows(engine) == before


def test_eager_final_checkpoint_needs_no_periodic_trigger(engine: Engine) -> None:
    coord = make(engine, {"a": (), "b": (), "c": ("a",)})
    epochs = start(coord, "a", "b")
    out = coord.finish("a", epochs["a"], eod())
    assert out.eager_checkpoint_id is not None
    assert out.threshold == out.eager_checkpoint_id
    info = coord.checkpoint(out.eager_checkpoint_id)
    assert info.reason is TriggerReason.EAGER_FINAL and info.kind is CheckpointKind.CHECKPOINT
    assert info.plan.to_ack == ("b",)
    assert out.end_of_data.finished_at_checkpoint == out.threshold
    assert coord.closable_checkpoint("a") is None
    assert coord.ensure_final_checkpoint("a") is None  # one is already in flight
    coord.record_batch("b", epochs["b"], finished_splits=["x"])
    assert coord.closable_checkpoint("a") == out.eager_checkpoint_id
    assert coord.close("a", epochs["a"], out.eager_checkpoint_id) == []
    view = coord.stage("a")
    assert view.lifecycle is StageLifecycle.CLOSED
    assert view.closed_checkpoint_id == out.eager_checkpoint_id


def test_eager_final_checkpoint_of_a_lone_stage_completes_at_once(engine: Engine) -> None:
    coord = make(engine, {"a": ()})
    epochs = start(coord, "a")
    out = coord.finish("a", epochs["a"], eod())
    assert out.eager_checkpoint_id == 1
    assert state_of(coord, 1) is CheckpointState.COMPLETED
    assert coord.closable_checkpoint("a") == 1


# ---------------------------------------------------------------------------------- 42/43/44


def test_out_of_order_completion_closes_on_the_first_completed(
    engine: Engine, writer: RecordingWriter
) -> None:
    """FLIP-147: finish, checkpoints 42, 43, 44 triggered, 43 completes first -> close on 43."""
    coord = make(engine, {"s": (), "r": ()}, writer=writer)
    epochs = start(coord, "s", "r")
    early = coord.trigger(MANUAL)
    assert early is not None
    coord.record_batch("s", epochs["s"], finished_splits=["s-1"], transactions=[txn("k", "t0")])
    coord.record_batch("r", epochs["r"], finished_splits=["r-1"])
    assert state_of(coord, early) is CheckpointState.COMPLETED
    assert coord.mark_committed("s", epochs["s"], "k", "t0") is True
    coord.record_batch("s", epochs["s"], finished_splits=["s-2"], transactions=[txn("k", "t1")])
    fin = coord.finish(
        "s", epochs["s"], eod().model_copy(update={"pending_transactions": (txn("k", "t2"),)})
    )
    t42 = fin.threshold
    assert fin.eager_checkpoint_id == t42
    t43, t44 = trig(coord), trig(coord)
    assert (t43, t44) == (t42 + 1, t42 + 2)
    # A transaction the finished stage opened after 43 was triggered (FlinkKafkaProducer opens
    # one per checkpoint): it reaches the store with an acknowledgement that is no longer
    # pending, and is covered by 44 only.
    late = txn("k", "t-late")
    assert (
        coord.acknowledge(early, "s", epochs["s"], StageSnapshot(pending_transactions=(late,)))
        is AckOutcome.NOT_PENDING
    )
    t45 = coord.trigger(MANUAL)
    assert t45 == t42 + 3
    # 43 completes first.
    assert coord.acknowledge(t43, "r", epochs["r"]) is AckOutcome.COMPLETED
    assert state_of(coord, t42) is CheckpointState.ABORTED  # subsumed
    assert state_of(coord, t44) is CheckpointState.PENDING
    assert coord.closable_checkpoint("s") == t43
    with pytest.raises(IllegalTransitionError, match=rf"needs a completed checkpoint >= {t42}"):
        coord.close("s", epochs["s"], early)
    with pytest.raises(IllegalTransitionError, match="t1"):
        coord.close("s", epochs["s"], t43)
    committable = {x.txn_id: x.checkpoint_id for x in coord.committable_transactions("s")}
    # t1 and t2 are covered by 42 (aborted, but 43 records the finished stage with them).
    assert committable == {"t1": t42, "t2": t42}
    assert {x.txn_id for x in writer.records[t43].stages["s"].pending_transactions} >= {
        "t1",
        "t2",
    }
    for x in coord.committable_transactions("s"):
        assert coord.mark_committed("s", epochs["s"], x.sink_id, x.txn_id) is True
    aborted = coord.close("s", epochs["s"], t43)
    assert [x.txn_id for x in aborted] == ["t-late"]
    assert txn_states(coord, "s") == {
        "t0": TransactionState.COMMITTED.value,
        "t1": TransactionState.COMMITTED.value,
        "t2": TransactionState.COMMITTED.value,
        "t-late": TransactionState.ABORTED.value,
    }
    view = coord.stage("s")
    assert view.lifecycle is StageLifecycle.CLOSED and view.closed_checkpoint_id == t43
    # 44 may still complete afterwards; it stays valid.
    assert coord.acknowledge(t44, "r", epochs["r"]) is AckOutcome.COMPLETED
    assert coord.stage("s").closed_checkpoint_id == t43
    assert coord.close("s", epochs["s"], t44) == []


def test_early_transaction_committed_on_the_checkpoint_that_covered_it(engine: Engine) -> None:
    coord = make(engine, {"s": ()})
    epochs = start(coord, "s")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    coord.record_batch("s", epochs["s"], finished_splits=["x"], transactions=[txn("k", "t0")])
    assert state_of(coord, cid) is CheckpointState.COMPLETED
    assert [x.txn_id for x in coord.committable_transactions("s")] == ["t0"]
    assert coord.mark_committed("s", epochs["s"], "k", "t0") is True


# ---------------------------------------------------------------------------------- savepoint


def test_finished_stage_waits_for_the_exact_savepoint(engine: Engine) -> None:
    coord = make(engine, {"s": (), "r": ()})
    epochs = start(coord, "s", "r")
    fin = coord.finish("s", epochs["s"], eod())
    coord.record_batch("r", epochs["r"], finished_splits=["r-1"])
    assert coord.closable_checkpoint("s") == fin.threshold
    stop = coord.request_stop(StopMode.SAVEPOINT, "alice")
    assert stop.savepoint_id is not None and stop.state is StopState.REQUESTED
    assert coord.checkpoint(stop.savepoint_id).kind is CheckpointKind.SAVEPOINT
    assert coord.closable_checkpoint("s") is None
    with pytest.raises(IllegalTransitionError, match="savepoint"):
        coord.close("s", epochs["s"], fin.threshold)
    out = coord.record_batch("r", epochs["r"], finished_splits=["r-2"])
    assert out.completed == (stop.savepoint_id,)
    assert coord.stop_request().state is StopState.COMPLETED  # type: ignore[union-attr]
    assert coord.closable_checkpoint("s") == fin.threshold
    assert coord.close("s", epochs["s"], fin.threshold) == []


def test_aborted_savepoint_fails_the_stop_and_the_stage_closes_normally(
    engine: Engine,
) -> None:
    coord = make(engine, {"s": (), "r": ()})
    epochs = start(coord, "s", "r")
    stop = coord.request_stop(StopMode.SAVEPOINT, "alice")
    sp = stop.savepoint_id
    assert sp is not None
    fin = coord.finish("s", epochs["s"], eod())  # finishes while the savepoint is taken
    assert fin.eager_checkpoint_id is None  # it waits for the savepoint instead
    assert ack_rows(engine, sp) == {"s": True}
    assert coord.closable_checkpoint("s") is None
    assert coord.ensure_final_checkpoint("s") is None
    coord.decline(sp, "r", epochs["r"], "cannot snapshot now")
    failed = coord.stop_request()
    assert failed is not None and failed.state is StopState.FAILED
    assert failed.failure_reason is not None
    assert f"savepoint {sp} aborted" in failed.failure_reason
    assert "cannot snapshot now" in failed.failure_reason
    # The run keeps running: the stage gets a checkpoint to close on.
    replacement = coord.ensure_final_checkpoint("s")
    assert replacement is not None and replacement >= fin.threshold
    assert coord.ensure_final_checkpoint("s") is None
    coord.record_batch("r", epochs["r"], finished_splits=["r-1"])
    assert coord.closable_checkpoint("s") == replacement
    coord.close("s", epochs["s"], replacement)
    assert coord.stage("s").lifecycle is StageLifecycle.CLOSED
    assert coord.trigger() is not None


def test_savepoint_timing_out_fails_the_stop(engine: Engine, clock: FakeClock) -> None:
    coord = make(engine, {"a": (), "b": ()}, clock=clock, timeout=30.0)
    epochs = start(coord, "a", "b")
    stop = coord.request_stop(StopMode.SAVEPOINT)
    coord.record_batch("a", epochs["a"])
    coord.suspend("a", epochs["a"])
    clock.advance(31)
    assert coord.expire_timed_out() == [stop.savepoint_id]
    failed = coord.stop_request()
    assert failed is not None and failed.state is StopState.FAILED
    assert failed.failure_reason is not None and "timed out" in failed.failure_reason
    assert coord.start_attempt("a").lifecycle is StageLifecycle.RUNNING  # the run goes on
    assert coord.trigger() is not None


def test_stage_finishing_during_a_savepoint_closes_after_resume(engine: Engine) -> None:
    coord = make(engine, {"s": (), "r": ()})
    epochs = start(coord, "s", "r")
    stop = coord.request_stop(StopMode.SAVEPOINT)
    fin = coord.finish("s", epochs["s"], eod())
    coord.record_batch("r", epochs["r"], finished_splits=["r-1"])
    coord.suspend("r", epochs["r"])
    assert state_of(coord, stop.savepoint_id) is CheckpointState.COMPLETED  # type: ignore[arg-type]
    assert coord.ensure_final_checkpoint("s") is None  # suspended: no new checkpoints
    resumed = coord.resume("bob")
    assert resumed.state is StopState.RESUMED
    epochs["r"] = coord.start_attempt("r").epoch
    coord.record_batch("r", epochs["r"], finished_splits=["r-2"])
    closable = coord.closable_checkpoint("s")
    assert closable is not None and closable >= fin.threshold
    coord.close("s", epochs["s"], closable)


# ---------------------------------------------------------------------------------- fencing


def test_stale_epoch_is_rejected_and_changes_nothing(engine: Engine) -> None:
    coord = make(engine, {"s": (), "r": ()})
    epochs = start(coord, "s", "r")
    old = epochs["s"]
    cid = coord.trigger(MANUAL)
    assert cid is not None
    new = coord.start_attempt("s").epoch
    assert new == old + 1
    before = store_rows(engine)
    stale_calls = {
        "acknowledge": lambda: coord.acknowledge(cid, "s", old, StageSnapshot()),
        "record_batch": lambda: coord.record_batch(
            "s", old, finished_splits=["x"], transactions=[txn("k", "zombie")]
        ),
        "finish": lambda: coord.finish("s", old, eod()),
        "decline": lambda: coord.decline(cid, "s", old, "zombie"),
    }
    for name, call in stale_calls.items():
        with pytest.raises(StaleEpochError) as err:
            call()
        assert (err.value.epoch, err.value.current) == (old, new), name
        assert "stale" in str(err.value)
        assert store_rows(engine) == before, name
    # The new attempt finishes; its commits and close are fenced against the old one too.
    coord.record_batch("s", new, finished_splits=["x"], transactions=[txn("k", "t1")])
    fin = coord.finish("s", new, eod())
    coord.acknowledge(cid, "r", epochs["r"])
    coord.record_batch("r", epochs["r"])
    closable = coord.closable_checkpoint("s")
    assert closable == fin.threshold
    newest = coord.start_attempt("s").epoch
    assert coord.stage("s").lifecycle is StageLifecycle.FINISHED  # a new attempt only waits
    before = store_rows(engine)
    for name, call in {
        "mark_committed": lambda: coord.mark_committed("s", new, "k", "t1"),
        "close": lambda: coord.close("s", new, closable),
    }.items():
        with pytest.raises(StaleEpochError):
            call()
        assert store_rows(engine) == before, name
    assert coord.mark_committed("s", newest, "k", "t1") is True
    coord.close("s", newest, closable)
    assert coord.stage("s").lifecycle is StageLifecycle.CLOSED


# ---------------------------------------------------------------------------------- txns


def test_transaction_commit_rules(engine: Engine) -> None:
    coord = make(engine, {"s": (), "r": ()})
    epochs = start(coord, "s", "r")
    e = epochs["s"]
    coord.record_batch("s", e, finished_splits=["a"], transactions=[txn("k", "t1")])
    with pytest.raises(IllegalTransitionError, match="not covered by a completed checkpoint"):
        coord.mark_committed("s", e, "k", "t1")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    coord.record_batch("s", e, finished_splits=["b"])  # acks: t1 is covered by a pending one
    assert coord.committable_transactions("s") == []
    with pytest.raises(IllegalTransitionError, match="not covered"):
        coord.mark_committed("s", e, "k", "t1")
    coord.record_batch("r", epochs["r"])
    assert state_of(coord, cid) is CheckpointState.COMPLETED
    assert [x.txn_id for x in coord.committable_transactions("s")] == ["t1"]
    assert coord.mark_committed("s", e, "k", "t1") is True
    assert coord.mark_committed("s", e, "k", "t1") is False  # idempotent
    assert coord.committable_transactions("s") == []
    with pytest.raises(IllegalTransitionError, match="no transaction 'nope'"):
        coord.mark_committed("s", e, "k", "nope")
    coord.record_batch("s", e, finished_splits=["c"], transactions=[txn("k", "t2")])
    reset = coord.reset_stage("s")
    assert txn_states(coord, "s") == {"t1": "COMMITTED", "t2": "ABORTED"}
    with pytest.raises(IllegalTransitionError, match="aborted"):
        coord.mark_committed("s", reset.epoch, "k", "t2")


def test_out_of_order_acks_never_make_an_uncovered_transaction_committable(
    engine: Engine, writer: RecordingWriter
) -> None:
    """A stage acknowledges 2, then 1 with a new transaction; 2 completes first. The transaction
    is not in checkpoint 2's snapshot, so 2 must not make it committable; a later checkpoint
    the stage acknowledges with it does."""
    coord = make(engine, {"r": (), "q": ()}, writer=writer)
    epochs = start(coord, "r", "q")
    one, two = trig(coord), trig(coord)
    assert (one, two) == (1, 2)
    assert coord.acknowledge(two, "r", epochs["r"]) is AckOutcome.ACCEPTED
    late = StageSnapshot(finished_splits=frozenset({"x"}), pending_transactions=(txn("k", "late"),))
    assert coord.acknowledge(one, "r", epochs["r"], late) is AckOutcome.ACCEPTED
    assert coord.acknowledge(two, "q", epochs["q"]) is AckOutcome.COMPLETED
    assert writer.records[two].stages["r"].pending_transactions == ()
    assert state_of(coord, one) is CheckpointState.ABORTED  # subsumed by 2
    assert coord.committable_transactions("r") == []
    with pytest.raises(IllegalTransitionError, match="not covered"):
        coord.mark_committed("r", epochs["r"], "k", "late")
    three = coord.trigger(MANUAL)
    assert three == 3
    coord.record_batch("r", epochs["r"])
    assert coord.record_batch("q", epochs["q"]).completed == (three,)
    assert [x.txn_id for x in writer.records[three].stages["r"].pending_transactions] == ["late"]
    assert [x.txn_id for x in coord.committable_transactions("r")] == ["late"]
    assert coord.mark_committed("r", epochs["r"], "k", "late") is True


# ---------------------------------------------------------------------------------- stops


def test_stop_with_savepoint_suspend_and_resume(engine: Engine) -> None:
    coord = make(engine, {"a": (), "b": ()})
    epochs = start(coord, "a", "b")
    stop = coord.request_stop(StopMode.SAVEPOINT, "alice")
    assert (stop.mode, stop.state, stop.requested_by) == (
        StopMode.SAVEPOINT,
        StopState.REQUESTED,
        "alice",
    )
    sp = stop.savepoint_id
    assert sp is not None
    assert coord.checkpoint(sp).reason is TriggerReason.SAVEPOINT
    assert coord.trigger() is None  # no periodic checkpoint during a savepoint stop
    assert coord.trigger(MANUAL) is None
    with pytest.raises(StopRequestError, match="still in progress"):
        coord.resume()
    with pytest.raises(StopRequestError, match="already stopping"):
        coord.request_stop(StopMode.DRAIN)
    out = coord.record_batch("a", epochs["a"], finished_splits=["a-1"])
    assert out.acked == (sp,) and out.stop is not None and out.stop.mode is StopMode.SAVEPOINT
    coord.suspend("a", epochs["a"])
    out = coord.record_batch("b", epochs["b"], finished_splits=["b-1"])
    assert out.completed == (sp,)
    coord.suspend("b", epochs["b"])
    done = coord.stop_request()
    assert done is not None and done.state is StopState.COMPLETED and done.finished_at is not None
    assert {v.lifecycle for v in coord.stages().values()} == {StageLifecycle.SUSPENDED}
    # a new attempt (a retry) while suspended stays suspended and only bumps the epoch
    again = coord.start_attempt("a")
    assert again.lifecycle is StageLifecycle.SUSPENDED and again.epoch == epochs["a"] + 1
    epochs["a"] = again.epoch
    with pytest.raises(StopRequestError, match="resume it first"):
        coord.request_stop(StopMode.SAVEPOINT)
    assert coord.trigger(MANUAL) is None
    resumed = coord.resume("bob")
    assert resumed.state is StopState.RESUMED and resumed.request_id == stop.request_id
    view = coord.start_attempt("a")
    assert view.lifecycle is StageLifecycle.RUNNING and view.epoch == epochs["a"] + 1
    assert view.progress.finished_splits == frozenset({"a-1"})
    assert coord.trigger() is not None
    with pytest.raises(StopRequestError, match="not suspended"):
        coord.resume()


def test_a_stage_starting_during_a_savepoint_stop_begins_suspended(engine: Engine) -> None:
    """The bug this guards: a downstream stage whose upstream closed on the savepoint must not
    start work (and then wait forever) while the run is suspended."""
    coord = make(engine, {"a": (), "b": ("a",)})
    epochs = start(coord, "a")
    fin = coord.finish("a", epochs["a"], eod())
    stop = coord.request_stop(StopMode.SAVEPOINT, "alice")
    assert stop.state is StopState.COMPLETED  # nothing running: completes at once
    assert stop.savepoint_id is not None and stop.savepoint_id >= fin.threshold
    assert coord.closable_checkpoint("a") == fin.threshold  # a closes on the eager checkpoint
    coord.close("a", epochs["a"], fin.threshold)
    view = coord.start_attempt("b")
    assert view.lifecycle is StageLifecycle.SUSPENDED
    assert coord.batch_boundary("b", view.epoch) == coord.stop_request()
    with pytest.raises(StaleEpochError):
        coord.batch_boundary("b", view.epoch - 1)
    coord.resume("bob")
    view = coord.start_attempt("b")
    assert view.lifecycle is StageLifecycle.RUNNING


def test_stop_with_drain(engine: Engine) -> None:
    coord = make(engine, {"a": (), "b": (), "c": ("a",)})
    epochs = start(coord, "a", "b")
    stop = coord.request_stop(StopMode.DRAIN, "alice")
    assert stop.state is StopState.REQUESTED and stop.savepoint_id is None
    fin_a = coord.finish("a", epochs["a"], eod(drain=True))
    assert coord.checkpoint(fin_a.threshold).kind is CheckpointKind.CHECKPOINT
    epochs.update(start(coord, "c"))
    fin_b = coord.finish("b", epochs["b"], eod(drain=True))
    assert coord.stop_request().state is StopState.REQUESTED  # type: ignore[union-attr]
    fin_c = coord.finish("c", epochs["c"], eod(drain=True))
    assert fin_c.end_of_data.drain is True
    done = coord.stop_request()
    assert done is not None and done.state is StopState.COMPLETED
    assert done.savepoint_id == fin_c.eager_checkpoint_id
    sp = coord.checkpoint(done.savepoint_id)  # type: ignore[arg-type]
    assert sp.kind is CheckpointKind.DRAINED_SAVEPOINT and sp.reason is TriggerReason.DRAIN
    assert sp.state is CheckpointState.COMPLETED
    assert set(sp.plan.fully_finished) == {"a", "b", "c"}
    assert coord.trigger() is None and coord.trigger(MANUAL) is None
    with pytest.raises(DrainedSavepointError, match="cannot be resumed"):
        coord.resume()
    with pytest.raises(StopRequestError, match="already drained"):
        coord.request_stop(StopMode.SAVEPOINT)
    for sid, fin in (("a", fin_a), ("b", fin_b), ("c", fin_c)):
        cid = coord.closable_checkpoint(sid)
        assert cid is not None and cid >= fin.threshold
        coord.close(sid, epochs[sid], cid)
    assert {v.lifecycle for v in coord.stages().values()} == {StageLifecycle.CLOSED}


def test_drain_when_everything_already_finished_completes_at_once(engine: Engine) -> None:
    coord = make(engine, {"a": ()})
    epochs = start(coord, "a")
    coord.finish("a", epochs["a"], eod())
    stop = coord.request_stop(StopMode.DRAIN)
    assert stop.state is StopState.COMPLETED and stop.savepoint_id is not None
    assert coord.checkpoint(stop.savepoint_id).kind is CheckpointKind.DRAINED_SAVEPOINT


def test_failed_drained_savepoint_fails_the_stop(engine: Engine, writer: RecordingWriter) -> None:
    coord = make(engine, {"a": ()}, writer=writer)
    epochs = start(coord, "a")
    coord.request_stop(StopMode.DRAIN)
    writer.fail_with = "storage offline"
    fin = coord.finish("a", epochs["a"], eod(drain=True))
    assert fin.eager_checkpoint_id is not None
    assert state_of(coord, fin.eager_checkpoint_id) is CheckpointState.ABORTED
    stop = coord.stop_request()
    assert stop is not None and stop.savepoint_id == fin.eager_checkpoint_id
    assert stop.state is StopState.FAILED
    assert stop.failure_reason is not None and "storage offline" in stop.failure_reason


def test_stop_on_a_finished_pipeline_is_refused(engine: Engine) -> None:
    coord = make(engine, {"a": ()})
    epochs = start(coord, "a")
    fin = coord.finish("a", epochs["a"], eod())
    coord.close("a", epochs["a"], fin.threshold)
    before = store_rows(engine)
    for mode in StopMode:
        with pytest.raises(StopRequestError, match="already finished"):
            coord.request_stop(mode)
    assert store_rows(engine) == before


# ---------------------------------------------------------------------------------- unknowns


def test_unknown_pipeline(engine: Engine) -> None:
    coord = Coordinator(engine, "no-such-pipeline", clock=FakeClock())
    for call in (
        coord.trigger,
        lambda: coord.start_attempt("a"),
        lambda: coord.acknowledge(1, "a", 1),
        lambda: coord.request_stop(StopMode.DRAIN),
        coord.graph,
    ):
        with pytest.raises(UnknownPipelineError, match=r"'no-such-pipeline' is not registered"):
            call()


def test_unknown_stage(engine: Engine) -> None:
    coord = make(engine, {"a": ()})
    start(coord, "a")
    cid = coord.trigger(MANUAL)
    assert cid is not None
    for call in (
        lambda: coord.start_attempt("ghost"),
        lambda: coord.acknowledge(cid, "ghost", 1),
        lambda: coord.record_batch("ghost", 1),
        lambda: coord.finish("ghost", 1, eod()),
        lambda: coord.closable_checkpoint("ghost"),
        lambda: coord.committable_transactions("ghost"),
        lambda: coord.stage("ghost"),
    ):
        with pytest.raises(UnknownStageError, match=rf"stage 'ghost' is not part of .*'{KEY}'"):
            call()


def test_unknown_checkpoint(engine: Engine) -> None:
    coord = make(engine, {"a": ()})
    epochs = start(coord, "a")
    fin = coord.finish("a", epochs["a"], eod())
    for call in (
        lambda: coord.acknowledge(99, "a", epochs["a"]),
        lambda: coord.abort(99, "x"),
        lambda: coord.checkpoint(99),
        lambda: coord.close("a", epochs["a"], 99),
    ):
        with pytest.raises(UnknownCheckpointError, match=rf"'{KEY}' has no checkpoint 99"):
            call()
    assert coord.stage("a").lifecycle is StageLifecycle.FINISHED
    assert fin.threshold == 1


def test_register_is_idempotent_and_keeps_progress(engine: Engine) -> None:
    coord = make(engine, {"a": ()})
    epochs = start(coord, "a")
    coord.record_batch("a", epochs["a"], finished_splits=["x"])
    coord.register(graph_of({"a": (), "b": ("a",)}), CoordinatorOptions(5, 30.0))
    stages = coord.stages()
    assert stages["a"].epoch == epochs["a"]
    assert stages["a"].progress.finished_splits == frozenset({"x"})
    assert stages["b"].lifecycle is StageLifecycle.NOT_STARTED
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(t.pipelines)).scalar_one() == 1
