"""A batch boundary that waits for the pipeline lock reads what the transition holding it
committed: on PostgreSQL the lock and the read go to the server together (one round trip) and
the read must still run after the lock is taken, with its own snapshot."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import CheckpointKind, SinkTransaction, TriggerReason
from airflow_finalckpt.core.views import BatchOutcome
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store import boundary as store_boundary
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "two-statements"])
def test_a_boundary_behind_the_lock_answers_the_checkpoint_triggered_while_it_waited(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pipelined: bool
) -> None:
    engine = make_engine(store_url)
    ensure_schema(engine)
    with engine.connect() as conn:
        # psycopg 3 with the libpq of its binary wheel: the one-round-trip path is taken
        assert store_boundary.pipelined(conn) is (engine.dialect.name == "postgresql")
    if not pipelined:  # a libpq without pipeline mode (< 14): the lock, then the read
        monkeypatch.setattr(store_boundary, "pipelined", lambda conn: False)
    coord = Coordinator(engine, "lock-read", writer=CheckpointStorage(str(tmp_path)))
    coord.register(StageGraph.from_edges(["a", "b"], []))
    a = coord.start_attempt("a", total_splits=4)
    coord.start_attempt("b", total_splits=4)
    outcome: list[BatchOutcome] = []
    started = threading.Event()

    def boundary() -> None:
        started.set()
        txn = SinkTransaction(sink_id="out", txn_id="t1", payload={"p": 1})
        outcome.append(coord.record_batch("a", a.epoch, finished_splits=["s1"], transactions=[txn]))

    worker = threading.Thread(target=boundary)
    with coord._transition() as tx:  # holds the pipeline lock
        cid = coord._ops.trigger(tx, CheckpointKind.CHECKPOINT, TriggerReason.MANUAL)
        worker.start()
        assert started.wait(5)
        time.sleep(0.5)  # the boundary is now waiting for the lock (SQLite: the write lock)
        assert not outcome
    worker.join(10)
    assert outcome, "the boundary did not finish"
    # it saw the checkpoint committed while it waited, answered it and covered its transaction
    assert outcome[0].acked == (cid,)
    with coord.store.read() as reader:
        acks = reader.acks(cid)
    assert set(acks) == {"a"}
    assert [t.checkpoint_id for t in acks["a"].snapshot.pending_transactions] == [cid]
    engine.dispose()
