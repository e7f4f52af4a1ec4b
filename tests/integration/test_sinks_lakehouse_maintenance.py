"""Table maintenance between a crash and its replay (issue 40 item 7): a transaction is committed
in the table, the process dies before the sink's committed marker, other writers commit after it,
and the table's history is expired (Iceberg ``expire_snapshots``; Delta checkpoint + log cleanup
and ``VACUUM``). The replay must still recognise the commit: every row once, no second commit.

Also a slice replace (``replace_slice``: several transactions in one commit) and a commit nobody
interrupted (maintenance after the marker), so each path that records a commit is covered.
Real pyiceberg (SQLite catalog) and deltalake tables on local disk.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
import pytest
from lakehouse_helpers import KINDS, commit_count, read_ids
from lakehouse_helpers import make_sink as make

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks.staged import StagedTableSink
from tests.extras import import_extra

import_extra("pyiceberg", "lakehouse")
import_extra("deltalake", "lakehouse")

ROWS = 5


class Crash(Exception):
    """Stands for the process dying between the table commit and the committed marker."""


def batch(first: int, region: str = "us") -> pa.Table:
    return pa.table(
        {
            "order_id": pa.array(range(first, first + ROWS), pa.int64()),
            "region": pa.array([region] * ROWS, pa.string()),
        }
    )


def staged(
    sink: StagedTableSink, txn_id: str, first: int, checkpoint: int, region: str = "us"
) -> SinkTransaction:
    sink.write_arrow(txn_id, batch(first, region))
    return sink.precommit(txn_id, checkpoint)


def crash_after_table_commit(sink: StagedTableSink) -> None:
    def step(name: str) -> None:
        if name == "table-committed":
            raise Crash(name)

    sink.on_step = step


def expire_history(kind: str, root: Path) -> None:
    """Routine maintenance: only the current snapshot / version's history is kept."""
    if kind == "iceberg":
        table = make(kind, root, "maintenance").table()
        assert table is not None
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
        table.maintenance.expire_snapshots().older_than(later).commit()
        expired = make(kind, root, "maintenance").table()
        assert expired is not None and len(expired.snapshots()) == 1
        return
    from deltalake import DeltaTable

    table = DeltaTable(f"{root}/delta/orders")
    table.alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 0 seconds"}, raise_if_not_exists=False
    )
    table = DeltaTable(f"{root}/delta/orders")
    table.create_checkpoint()
    table.cleanup_metadata()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    fresh = DeltaTable(f"{root}/delta/orders")
    assert len(fresh.history()) < fresh.version() + 1, "the log cleanup removed no commit"


@pytest.mark.parametrize("kind", KINDS)
def test_a_commit_whose_history_was_expired_before_its_replay_is_not_committed_twice(
    tmp_path: Path, kind: str
) -> None:
    sink = make(kind, tmp_path, "orders")
    first = staged(sink, "p1.b0.e1", 0, 1)
    assert sink.commit(first)
    interrupted = staged(sink, "p1.b1.e1", 100, 2)
    crash_after_table_commit(sink)
    with pytest.raises(Crash):
        sink.commit(interrupted)  # in the table now, no marker
    other = make(kind, tmp_path, "orders")  # another run of the same DAG, same sink
    assert other.commit(staged(other, "p2.b0.e1", 200, 1))
    assert other.commit(staged(other, "p2.b1.e1", 300, 2))
    expire_history(kind, tmp_path)

    replay = make(kind, tmp_path, "orders")
    assert replay.is_committed("p1.b1.e1")
    assert replay.commit(interrupted) is False  # a no-op, not a second commit
    ids = read_ids(replay)
    assert ids == sorted([*range(0, 5), *range(100, 105), *range(200, 205), *range(300, 305)])
    assert replay.staged_txn_ids() == set()
    assert "p1.b1.e1" in replay.committed_txn_ids()


@pytest.mark.parametrize("kind", KINDS)
def test_a_slice_replace_interrupted_and_expired_is_not_replaced_twice(
    tmp_path: Path, kind: str
) -> None:
    sink = make(kind, tmp_path, "daily", replace_slice={"region": "us"})
    txns = [staged(sink, f"p1.b{k}.e1", 10 * k, 1) for k in range(2)]
    crash_after_table_commit(sink)
    with pytest.raises(Crash):
        sink.commit_replacing(txns)
    for k in range(2):  # later appends by another sink on the same table
        appender = make(kind, tmp_path, "appender")
        assert appender.commit(staged(appender, f"p9.b{k}.e1", 500 + 10 * k, 1, "eu"))
    expire_history(kind, tmp_path)

    replay = make(kind, tmp_path, "daily", replace_slice={"region": "us"})
    assert replay.commit_replacing(txns) is False
    assert read_ids(replay) == sorted(
        [*range(0, 5), *range(10, 15), *range(500, 505), *range(510, 515)]
    )


@pytest.mark.parametrize("kind", KINDS)
def test_the_commit_records_do_not_grow_with_marked_transactions(tmp_path: Path, kind: str) -> None:
    """The durable record is only needed until the committed marker exists: later commits drop
    the records of marked transactions (Iceberg table properties), or they are one small
    ``txn`` entry per transaction (Delta; kept by the log's checkpoints)."""
    sink = make(kind, tmp_path, "orders")
    for k in range(4):
        assert sink.commit(staged(sink, f"p1.b{k}.e1", 10 * k, k + 1))
    assert commit_count(sink) == 4
    if kind == "iceberg":
        table = sink.table()
        assert table is not None
        records = [key for key in table.properties if key.startswith("finalckpt.committed.")]
        assert records == ["finalckpt.committed.orders/p1.b3.e1"]
    else:
        table = sink.table()
        assert table is not None
        assert all(table.transaction_version(f"finalckpt-orders/p1.b{k}.e1") == 1 for k in range(4))
    expire_history(kind, tmp_path)
    assert {f"p1.b{k}.e1" for k in range(4)} <= make(kind, tmp_path, "orders").committed_txn_ids()
