"""An acknowledgement covers the stage's uncovered transactions and records every uncommitted
one with its covering checkpoint (PostgreSQL stamps and reads them in one statement, SQLite in
two): the same result on both stores."""

from __future__ import annotations

from pathlib import Path

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import SinkTransaction, TriggerReason
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine


def txn(txn_id: str) -> SinkTransaction:
    return SinkTransaction(sink_id="out", txn_id=txn_id, payload={"staging": txn_id})


def test_ack_records_uncommitted_transactions_with_their_covering_checkpoint(
    store_url: str, tmp_path: Path
) -> None:
    engine = make_engine(store_url)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    coord = Coordinator(engine, "stamp", writer=storage)
    coord.register(StageGraph.from_edges(["a", "b"], []))
    a = coord.start_attempt("a", total_splits=10)
    b = coord.start_attempt("b", total_splits=10)
    # t1: recorded while no checkpoint waits (uncovered); the first ack covers it and t2
    coord.record_batch("a", a.epoch, finished_splits=["s1"], transactions=[txn("t1")])
    first = coord.trigger(TriggerReason.MANUAL)
    assert first is not None
    out = coord.record_batch("a", a.epoch, finished_splits=["s2"], transactions=[txn("t2")])
    assert out.acked == (first,)
    second = coord.trigger(TriggerReason.MANUAL)
    assert second is not None
    # t3 is covered by the second checkpoint, t1 and t2 keep the first
    coord.record_batch("a", a.epoch, finished_splits=["s3"], transactions=[txn("t3")])
    coord.record_batch("b", b.epoch, finished_splits=["x"])  # completes both
    for cid, expected in (
        (first, {"t1": first, "t2": first}),
        (second, {"t1": first, "t2": first, "t3": second}),
    ):
        info = coord.checkpoint(cid)
        assert info.metadata_path is not None
        stage = storage.read_checkpoint(info.metadata_path).stages["a"]
        got = {t.txn_id: t.checkpoint_id for t in stage.pending_transactions}
        assert got == expected
        assert [t.txn_id for t in stage.pending_transactions] == sorted(expected)
        assert all(t.payload == {"staging": t.txn_id} for t in stage.pending_transactions)
    engine.dispose()
