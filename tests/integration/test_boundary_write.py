"""A split-batch boundary written at once (one read, one write: ``store.boundary``) leaves the
store exactly as the step-by-step path does (a read and a write per checkpoint and table), on
SQLite and PostgreSQL: same progress, transactions with the same covering checkpoints,
acknowledgements with the same snapshots, counters, and the same checkpoint records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core import transitions_boundary
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import SinkTransaction, TriggerReason
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema


def txn(txn_id: str, sink: str = "out") -> SinkTransaction:
    return SinkTransaction(sink_id=sink, txn_id=txn_id, payload={"staging": f"{sink}/{txn_id}"})


#: Columns that differ between two runs of the same scenario (the paths read the clock a
#: different number of times; each run writes its own checkpoint directory).
VARYING = {"updated_at", "metadata_path"}


def scenario(url: str, root: Path) -> dict[str, Any]:
    """Three running stages, two sinks, overlapping checkpoints, a repeated and a committed
    transaction id; returns every row the boundaries wrote and the checkpoint records.
    """
    engine = make_engine(url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(root))
    coord = Coordinator(engine, "boundary", writer=storage, clock=lambda: 1000.0)
    coord.register(StageGraph.from_edges(["a", "b", "c"], []))
    ep = {sid: coord.start_attempt(sid, total_splits=10).epoch for sid in "abc"}
    outcomes = []

    def batch(sid: str, split: str, *txns: SinkTransaction) -> None:
        out = coord.record_batch(sid, ep[sid], finished_splits=[split], transactions=txns)
        outcomes.append((sid, out.acked, out.completed))

    batch("a", "s0", txn("t0"), txn("t0", sink="db"))  # uncovered: no checkpoint pending
    first = coord.trigger(TriggerReason.MANUAL)
    batch("a", "s1", txn("t1"), txn("t1", sink="db"))  # covers t0 and t1 with the first
    second = coord.trigger(TriggerReason.MANUAL)
    batch("b", "s1", txn("u1"))  # answers both at once
    batch("a", "s2", txn("t1"), txn("t2"))  # t1 again: recorded once; answers the second
    batch("c", "s1")  # completes the first, then the second (step by step)
    assert first is not None and second is not None
    assert coord.mark_committed("a", ep["a"], "out", "t0")
    third = coord.trigger(TriggerReason.MANUAL)
    batch("a", "s3", txn("t0"), txn("t3"))  # t0 is committed: neither re-recorded nor pending
    batch("c", "s2")
    batch("b", "s2")  # completes the third
    batch("c", "s3")  # nothing pending
    assert third is not None
    with engine.connect() as conn:
        rows = {
            table.name: sorted(
                tuple(str(v) for k, v in row.items() if k not in VARYING)
                for row in conn.execute(select(table)).mappings()
            )
            for table in (t.stages, t.transactions, t.acks, t.acks_due, t.checkpoints)
        }
    records = {}
    for cid in (first, second, third):
        info = coord.checkpoint(cid)
        assert info.metadata_path is not None
        record = storage.read_checkpoint(info.metadata_path)
        records[cid] = {sid: stage.model_dump(mode="json") for sid, stage in record.stages.items()}
    engine.dispose()
    return {"outcomes": outcomes, "rows": rows, "records": records}


def test_one_write_per_boundary_leaves_what_the_step_by_step_path_leaves(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_once = scenario(store_url, tmp_path / "at-once")
    # clean the store, then the same scenario step by step (no boundary decided at once)
    engine = make_engine(store_url)
    with engine.begin() as conn:
        for table in (t.acks, t.acks_due, t.transactions, t.checkpoints, t.stages, t.pipelines):
            conn.execute(table.delete())
    engine.dispose()
    monkeypatch.setattr(transitions_boundary, "decide_boundary", lambda *args: None)
    step_by_step = scenario(store_url, tmp_path / "step-by-step")
    assert at_once == step_by_step
    assert ("b", (1, 2), ()) in at_once["outcomes"]  # one boundary answered two checkpoints


def test_the_spy_sees_boundaries_decided_at_once(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decided: list[Any] = []
    real = transitions_boundary.decide_boundary

    def spy(*args: Any) -> Any:
        decided.append(real(*args))
        return decided[-1]

    monkeypatch.setattr(transitions_boundary, "decide_boundary", spy)
    scenario(store_url, tmp_path / "spied")
    written = [d for d in decided if d is not None]
    # every boundary but the two completing ones was written at once, four with a stamp, one
    # answering two checkpoints
    assert len(decided) == 9 and len(written) == 7
    assert sum(1 for d in written if d.stamp is not None) == 4
    assert any(len(d.acked) == 2 for d in written)
