"""decide_boundary: a batch boundary's acknowledgements decided at once, on plain values, as the
step-by-step path makes them."""

from __future__ import annotations

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.core.transitions_boundary import Awaiting, StoredTxn, decide_boundary


def txn(txn_id: str, cid: int | None = None, sink: str = "out") -> SinkTransaction:
    return SinkTransaction(sink_id=sink, txn_id=txn_id, checkpoint_id=cid, payload={"p": txn_id})


def stored(txn_id: str, cid: int | None, state: str = "PRECOMMITTED") -> StoredTxn:
    return StoredTxn(txn(txn_id, cid), state)


def test_no_pending_checkpoint_records_the_batch_uncovered() -> None:
    got = decide_boundary([], None, [stored("a", 3)], [txn("b", cid=7)])
    assert got is not None
    assert got.acked == () and got.stamp is None
    # the caller's checkpoint id on a new transaction is not what is stored: uncovered
    assert got.new == (txn("b"),)
    assert got.uncommitted == (txn("a", 3), txn("b"))


def test_the_oldest_awaiting_checkpoint_covers_every_uncovered_transaction() -> None:
    awaiting = [Awaiting(9, 3, 1.0), Awaiting(8, 2, 0.5)]
    got = decide_boundary(awaiting, 4, [stored("a", None), stored("c", 5)], [txn("b")])
    assert got is not None
    assert [a.checkpoint_id for a in got.acked] == [8, 9]
    assert got.stamp == 8
    assert got.uncommitted == (txn("a", 8), txn("b", 8), txn("c", 5))


def test_a_stage_that_acknowledged_a_newer_checkpoint_does_not_stamp_an_older_one() -> None:
    # out of order: the stage answered 12 already; 10 must not claim its new transactions
    got = decide_boundary([Awaiting(10, 4, 0.0), Awaiting(13, 2, 0.0)], 12, [], [txn("n")])
    assert got is not None
    assert got.stamp == 13
    got = decide_boundary([Awaiting(10, 4, 0.0)], 12, [], [txn("n")])
    assert got is not None
    assert got.stamp is None
    assert got.uncommitted == (txn("n"),)


def test_a_stored_id_is_not_recorded_again_and_a_committed_one_is_not_uncommitted() -> None:
    batch = [txn("kept"), txn("done"), txn("fresh"), txn("fresh")]
    have = [stored("kept", 2), stored("done", 1, state="COMMITTED")]
    got = decide_boundary([Awaiting(5, 2, 0.0)], None, have, batch)
    assert got is not None
    assert got.new == (txn("fresh"),)
    assert got.uncommitted == (txn("fresh", 5), txn("kept", 2))


def test_an_answer_that_completes_its_checkpoint_takes_the_step_by_step_path() -> None:
    assert decide_boundary([Awaiting(5, 3, 0.0), Awaiting(6, 1, 0.0)], None, [], []) is None


def test_uncommitted_are_ordered_by_sink_then_id() -> None:
    batch = [txn("b", sink="y"), txn("a", sink="y"), txn("z", sink="x")]
    got = decide_boundary([], None, [], batch)
    assert got is not None
    assert [(t.sink_id, t.txn_id) for t in got.uncommitted] == [("x", "z"), ("y", "a"), ("y", "b")]


def test_nothing_uncovered_writes_no_stamp() -> None:
    got = decide_boundary([Awaiting(5, 2, 0.0)], None, [stored("a", 3)], [])
    assert got is not None
    assert [a.checkpoint_id for a in got.acked] == [5]
    assert got.stamp is None
    assert got.uncommitted == (txn("a", 3),)
