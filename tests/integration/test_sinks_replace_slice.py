"""``replace_slice`` on the four sinks with a real local Spark: a stage's transactions replace
the slice a pipeline run owns in one commit (Parquet partition swap, SQL delete + insert in one
database transaction, Iceberg overwrite snapshot, Delta remove + add in one version); other
slices stay; a replay (whole group or its rest, from a fresh sink object) changes nothing; rows
outside the slice are refused before anything is staged; a crash in the middle of the Parquet
swap leaves the old slice readable and the replay completes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession

from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks import (
    DeltaTableSink,
    IcebergTableSink,
    ParquetTableSink,
    SinkError,
    SqlTableSink,
    parquet_slices,
)
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink

KINDS = ["parquet", "sql", pytest.param("sql_pg", marks=pytest.mark.postgres), "iceberg", "delta"]
#: The PostgreSQL database of a ``sql_pg`` case, by test directory.
PG_URLS: dict[Path, str] = {}
A, B = "2013-01-05", "2013-01-06"


def make(kind: str, root: Path, day: str) -> TwoPhaseCommitSink:
    """The sink ``flights`` under ``root`` owning ``event_date = day``."""
    owned = {"event_date": day}
    if kind == "parquet":
        return ParquetTableSink("flights", f"{root}/parquet", replace_slice=owned)
    if kind in ("sql", "sql_pg"):
        url = PG_URLS[root] if kind == "sql_pg" else f"sqlite:///{root}/db.sqlite"
        return SqlTableSink("flights", url, "flights", replace_slice=owned)
    if kind == "iceberg":
        return IcebergTableSink(
            "flights", "db.flights", warehouse=f"{root}/warehouse", replace_slice=owned
        )
    return DeltaTableSink("flights", f"{root}/delta", replace_slice=owned)


def rows(spark: SparkSession, day: str, numbers: range) -> DataFrame:
    return spark.createDataFrame([(day, n) for n in numbers], "event_date string, n long")


def stage(sink: TwoPhaseCommitSink, txn_id: str, frame: DataFrame, cid: int) -> SinkTransaction:
    sink.write_spark(txn_id, frame)
    return sink.precommit(txn_id, cid)


def table(kind: str, root: Path) -> dict[str, list[int]]:
    """The committed rows by day, read by a fresh sink object."""
    frame: pd.DataFrame = make(kind, root, A).read_pandas()  # type: ignore[attr-defined]
    if frame.empty:
        return {}
    return {
        str(day): sorted(int(n) for n in group["n"]) for day, group in frame.groupby("event_date")
    }


@pytest.mark.parametrize("kind", KINDS)
def test_a_rerun_replaces_its_slice_once_and_keeps_the_others(
    spark: SparkSession, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    if kind == "sql_pg":
        PG_URLS[tmp_path] = str(request.getfixturevalue("pg_url"))
    first = make(kind, tmp_path, A)
    t1 = stage(first, "p.p1.b0.e1", rows(spark, A, range(0, 5)), 1)
    t2 = stage(first, "p.p1.b1.e1", rows(spark, A, range(5, 9)), 2)
    assert table(kind, tmp_path) == {}  # staged, invisible
    assert first.commit_replacing([t1, t2]) is True
    other = make(kind, tmp_path, B)
    assert other.commit_replacing([stage(other, "p.p2.b0.e1", rows(spark, B, range(100, 103)), 1)])
    assert table(kind, tmp_path) == {A: list(range(9)), B: [100, 101, 102]}

    rerun = make(kind, tmp_path, A)  # the day again, in a new pipeline run
    r1 = stage(rerun, "p.p3.b0.e1", rows(spark, A, range(20, 23)), 1)
    assert rerun.commit_replacing([r1]) is True
    want = {A: [20, 21, 22], B: [100, 101, 102]}
    assert table(kind, tmp_path) == want

    # replays after a crash, from fresh objects: the group, its rest, the rerun: no change
    assert make(kind, tmp_path, A).commit_replacing([t1, t2]) is False
    assert make(kind, tmp_path, A).commit_replacing([t2]) is False
    assert make(kind, tmp_path, A).commit_replacing([r1]) is False
    assert table(kind, tmp_path) == want
    fresh = make(kind, tmp_path, A)
    assert {t1.txn_id, t2.txn_id, r1.txn_id} <= fresh.committed_txn_ids()
    assert fresh.is_committed(t2.txn_id)
    assert fresh.staged_txn_ids() == set()

    with pytest.raises(SinkError, match="rows outside replace_slice"):
        rerun.write_spark("p.p4.b0.e1", rows(spark, B, range(1)))
    assert fresh.staged_txn_ids() == set()  # nothing staged


def test_iceberg_replaces_in_one_overwrite_snapshot(spark: SparkSession, tmp_path: Path) -> None:
    sink = make("iceberg", tmp_path, A)
    assert sink.commit_replacing([stage(sink, "p.p1.b0.e1", rows(spark, A, range(3)), 1)])
    rerun = make("iceberg", tmp_path, A)
    t1 = stage(rerun, "p.p2.b0.e1", rows(spark, A, range(10, 12)), 1)
    t2 = stage(rerun, "p.p2.b1.e1", rows(spark, A, range(12, 14)), 2)
    before = len(rerun.table().snapshots())  # type: ignore[attr-defined]
    assert rerun.commit_replacing([t1, t2])
    iceberg: Any = rerun.table()  # type: ignore[attr-defined]
    assert len(iceberg.snapshots()) == before + 1
    summary = iceberg.current_snapshot().summary
    assert summary.operation.value == "overwrite"
    assert summary["finalckpt.txn-ids"] == "p.p2.b0.e1,p.p2.b1.e1"


def test_delta_replaces_in_one_version(spark: SparkSession, tmp_path: Path) -> None:
    sink = make("delta", tmp_path, A)
    assert sink.commit_replacing([stage(sink, "p.p1.b0.e1", rows(spark, A, range(3)), 1)])
    rerun = make("delta", tmp_path, A)
    delta: Any = rerun.table()  # type: ignore[attr-defined]
    version = delta.version()
    assert rerun.commit_replacing([stage(rerun, "p.p2.b0.e1", rows(spark, A, range(7, 9)), 1)])
    delta = rerun.table()  # type: ignore[attr-defined]
    assert delta.version() == version + 1
    assert sorted(delta.to_pandas()["n"]) == [7, 8]


@pytest.mark.parametrize("exchange", [True, False])
def test_a_crash_in_the_parquet_swap_never_leaves_the_slice_empty_or_doubled(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    sink = make("parquet", tmp_path, A)
    assert sink.commit_replacing([stage(sink, "p.p1.b0.e1", rows(spark, A, range(3)), 1)])
    rerun = make("parquet", tmp_path, A)
    txns = [
        stage(rerun, "p.p2.b0.e1", rows(spark, A, range(10, 12)), 1),
        stage(rerun, "p.p2.b1.e1", rows(spark, A, range(12, 14)), 2),
    ]

    class Crash(RuntimeError):
        pass

    def crash(*_args: Any) -> None:
        raise Crash("killed before the swap")

    monkeypatch.setattr(parquet_slices.SliceSwap, "_swap", crash)
    with pytest.raises(Crash):
        rerun.commit_replacing(txns)
    assert table("parquet", tmp_path) == {A: [0, 1, 2]}  # the group is built, hidden
    monkeypatch.undo()
    if not exchange:  # two renames: old aside, new in
        monkeypatch.setattr(parquet_slices, "_exchange", lambda _a, _b: False)
    assert make("parquet", tmp_path, A).commit_replacing(txns) is True
    assert table("parquet", tmp_path) == {A: [10, 11, 12, 13]}
    assert make("parquet", tmp_path, A).commit_replacing(txns) is False
    leftovers = sorted(p.name for p in (tmp_path / "parquet" / "_slices").iterdir())
    assert leftovers == ["_txn"]  # the old partition and the group directory are gone
    # a plain directory reader sees the partition like any Hive-style table
    plain = spark.read.option("recursiveFileLookup", "true").parquet(str(tmp_path / "parquet"))
    assert sorted(r.n for r in plain.collect()) == [10, 11, 12, 13]


@pytest.mark.parametrize("kind", KINDS)
def test_a_slice_of_typed_columns_is_replaced(
    spark: SparkSession, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """A DATE and an INT slice column with the string values a template renders: PostgreSQL
    refused the delete (``date = character varying``) at commit, after the other sinks had
    committed (found by a user DAG publishing ``to_date(...)`` days).
    """
    if kind == "sql_pg":
        PG_URLS[tmp_path] = str(request.getfixturevalue("pg_url"))
    owned = {"event_date": A, "hour": "7"}

    def typed(numbers: range) -> DataFrame:
        frame = spark.createDataFrame([(A, 7, n) for n in numbers], "d string, hour int, n long")
        return frame.selectExpr("to_date(d) AS event_date", "hour", "n")

    def sink() -> TwoPhaseCommitSink:
        made = make(kind, tmp_path, A)
        made.replace_slice = owned  # as the operator renders it: strings
        return made

    first = sink()
    assert first.commit_replacing([stage(first, "p.p1.b0.e1", typed(range(3)), 1)])
    rerun = sink()
    assert rerun.commit_replacing([stage(rerun, "p.p2.b0.e1", typed(range(10, 12)), 1)])
    frame: pd.DataFrame = sink().read_pandas()  # type: ignore[attr-defined]
    assert sorted(int(n) for n in frame["n"]) == [10, 11]


@pytest.mark.parametrize("kind", KINDS)
def test_a_rerun_without_rows_empties_its_slice(
    spark: SparkSession, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """A new run of a day whose input is gone (a stage with no input pre-commits its finish
    transaction without rows) leaves the day empty, as the plain job would, in every sink."""
    if kind == "sql_pg":
        PG_URLS[tmp_path] = str(request.getfixturevalue("pg_url"))
    first = make(kind, tmp_path, A)
    assert first.commit_replacing([stage(first, "p.p1.b0.e1", rows(spark, A, range(3)), 1)])
    other = make(kind, tmp_path, B)
    assert other.commit_replacing([stage(other, "p.p2.b0.e1", rows(spark, B, range(5, 7)), 1)])
    rerun = make(kind, tmp_path, A)
    empty = rerun.precommit("p.p3.finish.e1", 1)  # nothing written
    rerun.commit_replacing([empty])
    assert table(kind, tmp_path) == {B: [5, 6]}
    assert make(kind, tmp_path, A).commit_replacing([empty]) is False  # a replay: no change
    assert table(kind, tmp_path) == {B: [5, 6]}


def test_plain_readers_read_a_sliced_parquet_table(spark: SparkSession, tmp_path: Path) -> None:
    """docs/sinks.md's readers on a table with slices (``event_date=<day>/`` directories whose
    files hold ``event_date`` too): every row once, the column as written (a string)."""
    import duckdb
    import pyarrow.dataset as pads

    for day, numbers in ((A, range(3)), (B, range(5, 7))):
        sink = make("parquet", tmp_path, day)
        assert sink.commit_replacing([stage(sink, f"p.{day}.b0.e1", rows(spark, day, numbers), 1)])
    path = str(tmp_path / "parquet")
    frames = {
        "pandas": pd.read_parquet(path, partitioning=None),
        "pyarrow": pads.dataset(path).to_table().to_pandas(),
        "duckdb": duckdb.sql(  # type: ignore[union-attr]
            f"SELECT * FROM read_parquet('{path}/*/*.parquet', hive_partitioning=false)"
        ).df(),
        "spark": spark.read.option("recursiveFileLookup", "true").parquet(path).toPandas(),
    }
    for reader, frame in frames.items():
        got = sorted(zip(frame["event_date"], frame["n"], strict=True))
        assert got == [(A, 0), (A, 1), (A, 2), (B, 5), (B, 6)], reader
    # the defaults take the directories for Hive partitions: pandas fails, DuckDB retypes
    with pytest.raises(Exception, match="Unable to merge: Field event_date has incompatible"):
        pd.read_parquet(path)
    hive = duckdb.sql(f"SELECT typeof(event_date) FROM read_parquet('{path}/*/*.parquet')")
    assert hive.fetchall()[0] == ("DATE",)  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["parquet", "sql", "iceberg", "delta"])
def test_a_batch_without_the_slice_column_is_refused_naming_it(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    """A transform that dropped the slice column got Spark's UNRESOLVED_COLUMN from inside the
    sink's slice check, naming neither the sink nor ``replace_slice``."""
    sink = make(kind, tmp_path, A)
    frame = rows(spark, A, range(2)).drop("event_date")
    with pytest.raises(SinkError, match=r"sink 'flights': replace_slice column 'event_date' is "):
        sink.write_spark("p.p1.b0.e1", frame)
    assert sink.staged_txn_ids() == set()
