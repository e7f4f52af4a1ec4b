"""Concurrent commits of different transactions into ONE Iceberg / Delta table, as a backfill's
runs (``max_active_runs=3``) commit their days: a real commit conflict, forced, is retried on
the new table version and loses nothing.

The conflict is forced, not hoped for: both committers stop right before the library's commit
call (pyiceberg ``Transaction.commit_transaction``, deltalake
``DeltaTable.create_write_transaction``) until both have built their commit on the same table
version; then both commit at once and the table format accepts one. Real Spark stages the files,
real pyiceberg (SQLite catalog) and deltalake commit them. The loser's retry re-reads the table
(its slice replace re-reads the slice's files), so each day ends exactly once, the other's commit
stays, and replaying either commit afterwards changes nothing. Concurrent first runs racing to
create the table (and the Iceberg catalog) are covered too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink
from airflow_finalckpt.sinks.staged import StagedTableSink

KINDS = ["iceberg", "delta"]
A, B = "2013-01-05", "2013-01-06"
CONFLICT_LOG = "lost to a concurrent writer"


def make(kind: str, root: Path, day: str | None) -> StagedTableSink:
    """The sink ``flights`` under ``root``, owning ``event_date = day`` (None: appending)."""
    owned = {"event_date": day} if day is not None else None
    if kind == "iceberg":
        return IcebergTableSink(
            "flights", "db.flights", warehouse=f"{root}/warehouse", replace_slice=owned
        )
    return DeltaTableSink("flights", f"{root}/delta", replace_slice=owned)


def rows(spark: SparkSession, day: str, numbers: range) -> DataFrame:
    return spark.createDataFrame([(day, n) for n in numbers], "event_date string, n long")


def stage(sink: StagedTableSink, txn_id: str, frame: DataFrame, cid: int) -> SinkTransaction:
    sink.write_spark(txn_id, frame)
    return sink.precommit(txn_id, cid)


def by_day(kind: str, root: Path) -> dict[str, list[int]]:
    """The committed rows by day (duplicates kept), read by a fresh sink object."""
    frame: pd.DataFrame = make(kind, root, None).read_pandas()
    return {
        str(day): sorted(int(n) for n in group["n"]) for day, group in frame.groupby("event_date")
    }


def library_commit(kind: str, first_commit: bool = False) -> tuple[Any, str]:
    """Where the library commits: (owner, attribute) to gate."""
    if kind == "iceberg":
        import pyiceberg.table

        return pyiceberg.table.Transaction, "commit_transaction"
    if first_commit:  # the commit creating the Delta table (imported at call time)
        import deltalake.transaction

        return deltalake.transaction, "create_table_with_add_actions"
    import deltalake

    return deltalake.DeltaTable, "create_write_transaction"


def gate(owner: Any, name: str, monkeypatch: pytest.MonkeyPatch, parties: int) -> None:
    """Hold each thread's first call of ``owner.name`` until ``parties`` threads reached theirs:
    all of them then commit on the table version they read before.
    """
    original = getattr(owner, name)
    barrier = threading.Barrier(parties, timeout=120)
    held: set[int] = set()

    def gated(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() not in held:
            held.add(threading.get_ident())
            barrier.wait()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, gated)


def at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls in threads started together; their results in order (errors re-raised)."""
    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = calls[index]()
        except BaseException as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def conflicts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if CONFLICT_LOG in r.getMessage()]


@pytest.mark.parametrize("kind", KINDS)
def test_two_runs_replacing_their_days_at_once_both_land_exactly_once(
    spark: SparkSession,
    tmp_path: Path,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the days as an earlier backfill left them
    for day, old in ((A, range(0, 3)), (B, range(10, 13))):
        sink = make(kind, tmp_path, day)
        assert sink.commit_replacing([stage(sink, f"old.{day}.b0.e1", rows(spark, day, old), 1)])
    assert by_day(kind, tmp_path) == {A: [0, 1, 2], B: [10, 11, 12]}

    # a reprocess of both days, their runs committing at the same moment
    run_a, run_b = make(kind, tmp_path, A), make(kind, tmp_path, B)
    txns_a = [
        stage(run_a, "a.b0.e2", rows(spark, A, range(100, 104)), 2),
        stage(run_a, "a.b1.e2", rows(spark, A, range(104, 106)), 3),
    ]
    txns_b = [stage(run_b, "b.b0.e2", rows(spark, B, range(200, 203)), 2)]
    gate(*library_commit(kind), monkeypatch, parties=2)
    caplog.set_level(logging.WARNING, logger="airflow_finalckpt.sinks.commit_retry")
    both = [partial(run_a.commit_replacing, txns_a), partial(run_b.commit_replacing, txns_b)]
    assert at_once(both) == [True, True]

    lost = conflicts(caplog)
    assert len(lost) == 1, lost  # a real conflict: one committer lost the race, and retried
    assert "attempt 1 of" in lost[0]
    want = {A: list(range(100, 106)), B: [200, 201, 202]}
    assert by_day(kind, tmp_path) == want
    commits = make(kind, tmp_path, None).table_commits()
    assert commits.count("a.b0.e2") == 1 and commits.count("b.b0.e2") == 1
    assert len(commits) == 4  # two seeds, two replaces: the loser's retry committed once

    # a replay of either commit (a crash before its markers) changes nothing
    monkeypatch.undo()
    assert make(kind, tmp_path, A).commit_replacing(txns_a) is False
    assert make(kind, tmp_path, B).commit_replacing(txns_b) is False
    assert by_day(kind, tmp_path) == want
    assert make(kind, tmp_path, None).table_commits() == commits


@pytest.mark.parametrize("kind", KINDS)
def test_three_first_runs_appending_at_once_lose_nothing(
    spark: SparkSession,
    tmp_path: Path,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # three first runs on a fresh warehouse stage at once (Iceberg creates the catalog and the
    # table from the first batch: they race to), then commit at once on the same version
    # (Delta: all three create the table; Iceberg: all three append to its empty snapshot)
    sinks = [make(kind, tmp_path, None) for _ in range(3)]
    frames = [rows(spark, A, range(10 * i, 10 * i + 3)) for i in range(3)]
    at_once([partial(s.write_spark, f"t{i}.b0.e1", frames[i]) for i, s in enumerate(sinks)])
    txns = [sink.precommit(f"t{i}.b0.e1", 1) for i, sink in enumerate(sinks)]
    gate(*library_commit(kind, first_commit=True), monkeypatch, parties=3)
    caplog.set_level(logging.WARNING, logger="airflow_finalckpt.sinks.commit_retry")
    assert at_once([partial(sink.commit, txn) for sink, txn in zip(sinks, txns, strict=True)]) == [
        True,
        True,
        True,
    ]

    assert len(conflicts(caplog)) >= 2  # at least two lost a race (one may lose twice)
    want = {A: [0, 1, 2, 10, 11, 12, 20, 21, 22]}
    assert by_day(kind, tmp_path) == want
    history = make(kind, tmp_path, None).table_commits()
    assert sorted(c for c in history if c) == ["t0.b0.e1", "t1.b0.e1", "t2.b0.e1"]
    monkeypatch.undo()
    assert [make(kind, tmp_path, None).commit(t) for t in txns] == [False, False, False]
    assert by_day(kind, tmp_path) == want
