"""SqlTableSink on real SQLite files and a real PostgreSQL server (same tests, parametrized).

PostgreSQL tests get a uniquely named database created for this session and dropped after it.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pytest
from sqlalchemy import BigInteger, Date, Numeric, String, inspect, select, text
from sqlalchemy.engine import make_url

from airflow_finalckpt.core.errors import StorageError
from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks import (
    AlreadyCommittedError,
    ForeignTransactionError,
    InvalidIdentifierError,
    NotPrecommittedError,
    SinkError,
    SinkTransactionError,
    SqlTableSink,
)
from airflow_finalckpt.sinks.sql import COMMITS_TABLE

PG_SERVER_URL = os.environ.get(
    "FINALCKPT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PG_UNREACHABLE = "PostgreSQL not reachable at 127.0.0.1:5432"

HOSTILE_IDS = ["", "..", "../x", "a/b", "a\x00b", "x" * 300, "caf\u00e9", "a b", "a;drop"]

SinkFactory = Callable[..., SqlTableSink]


def _pg_connect_kwargs(database: str) -> dict[str, Any]:
    url = make_url(PG_SERVER_URL)
    return {
        "host": url.host or "127.0.0.1",
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "password": url.password,
        "dbname": database,
        "connect_timeout": 5,
        "autocommit": True,
    }


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped afterwards."""
    try:
        admin = psycopg.connect(**_pg_connect_kwargs("postgres"))
    except psycopg.OperationalError as exc:
        if os.environ.get("FINALCKPT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{PG_UNREACHABLE} and FINALCKPT_REQUIRE_POSTGRES=1: {exc}")
        pytest.skip(PG_UNREACHABLE)
    name = f"finalckpt_sinks_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield (
                make_url(PG_SERVER_URL)
                .set(drivername="postgresql+psycopg", database=name)
                .render_as_string(hide_password=False)
            )
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sinks.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def table() -> str:
    """A table name no other test uses (PostgreSQL tests share one database)."""
    return f"orders_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def sink_id() -> str:
    """A sink id no other test uses: commit records of one database are shared by all sinks."""
    return f"orders_sink_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_sink(db_url: str, table: str, sink_id: str) -> Iterator[SinkFactory]:
    """New sink objects on one table: a fresh one per call simulates a restarted process."""
    created: list[SqlTableSink] = []

    def factory(name: str | None = None, **options: Any) -> SqlTableSink:
        sink = SqlTableSink(sink_id if name is None else name, db_url, table, **options)
        created.append(sink)
        return sink

    yield factory
    for sink in created:
        sink.dispose()


def frame(*values: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "order_id": list(values),
            "amount": [v * 1.5 for v in values],
            "customer": [f"c{v}" for v in values],
        }
    )


def committed_ids(sink: SqlTableSink) -> list[int]:
    data = sink.read_pandas()
    return sorted(data["order_id"].tolist()) if len(data.columns) else []


def stage(sink: SqlTableSink, txn_id: str, *values: int, ckpt: int = 1) -> SinkTransaction:
    sink.write_pandas(txn_id, frame(*values))
    return sink.precommit(txn_id, ckpt)


def staged_row_count(sink: SqlTableSink) -> int:
    with sink.engine.connect() as conn:
        query = text(f'SELECT count(*) FROM "{sink.staging_table_name}"')
        return int(conn.execute(query).scalar_one())


def commit_records(sink: SqlTableSink) -> list[tuple[str, int, int | None]]:
    with sink.engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT txn_id, rows, checkpoint_id FROM {COMMITS_TABLE} "
                "WHERE sink_id = :sink ORDER BY txn_id"
            ),
            {"sink": sink.sink_id},
        )
        return [tuple(row) for row in rows]


# -- commit ------------------------------------------------------------------------------------


def test_commit_publishes_exactly_the_staged_rows(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.write_pandas("s1-e1-b1", frame(1, 2))
    sink.write_pandas("s1-e1-b1", frame(3))
    txn = sink.precommit("s1-e1-b1", 7)

    assert (txn.sink_id, txn.txn_id, txn.checkpoint_id) == (sink.sink_id, "s1-e1-b1", 7)
    assert txn.payload["rows"] == 3
    assert sink.commit(txn) is True

    data = sink.read_pandas().sort_values("order_id").reset_index(drop=True)
    assert data["order_id"].tolist() == [1, 2, 3]
    assert data["amount"].tolist() == [1.5, 3.0, 4.5]
    assert data["customer"].tolist() == ["c1", "c2", "c3"]
    assert staged_row_count(sink) == 0
    assert commit_records(sink) == [("s1-e1-b1", 3, 7)]
    assert sink.is_committed("s1-e1-b1") and sink.committed_txn_ids() == {"s1-e1-b1"}


def test_second_commit_is_a_noop(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = stage(sink, "t1", 1, 2)

    assert sink.commit(txn) is True
    assert sink.commit(txn) is False
    assert committed_ids(sink) == [1, 2]
    assert commit_records(sink) == [("t1", 2, 1)]


def test_commit_after_crash_uses_a_fresh_sink_object(make_sink: SinkFactory) -> None:
    """Crash between pre-commit and commit: the restored sink reflects the existing tables."""
    txn_json = stage(make_sink(), "t1", 1, 2, 3).model_dump_json()

    restored = make_sink()
    assert committed_ids(restored) == []
    assert restored.commit(SinkTransaction.model_validate_json(txn_json)) is True
    assert make_sink().commit(SinkTransaction.model_validate_json(txn_json)) is False
    assert committed_ids(make_sink()) == [1, 2, 3]


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_two_transactions_commit_in_either_order(
    make_sink: SinkFactory, order: tuple[str, str]
) -> None:
    sink = make_sink()
    txns = {"a": stage(sink, "a", 1, 2, ckpt=1), "b": stage(sink, "b", 3, ckpt=2)}

    assert sink.commit(txns[order[0]]) is True
    assert committed_ids(sink) == ([1, 2] if order[0] == "a" else [3])
    assert sink.commit(txns[order[1]]) is True
    assert committed_ids(sink) == [1, 2, 3]
    assert sink.committed_txn_ids() == {"a", "b"}


def test_sinks_sharing_a_database_keep_separate_records(
    make_sink: SinkFactory, sink_id: str
) -> None:
    first, second = make_sink(f"{sink_id}_one"), make_sink(f"{sink_id}_two")
    txn = stage(first, "same-id", 1)
    assert first.commit(txn) is True
    assert second.committed_txn_ids() == set() and not second.is_committed("same-id")
    assert second.commit(stage(second, "same-id", 2)) is True
    assert committed_ids(first) == [1, 2]


def test_empty_transaction_without_any_table_commits(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = sink.precommit("nothing-written", 3)

    assert txn.payload["rows"] == 0
    assert sink.commit(txn) is True
    assert sink.is_committed("nothing-written")
    assert commit_records(sink) == [("nothing-written", 0, 3)]
    assert sink.read_pandas().empty


def test_declared_columns_create_the_table_before_any_data(make_sink: SinkFactory) -> None:
    sink = make_sink(
        columns={"order_id": BigInteger, "price": Numeric(10, 2), "day": Date(), "who": String(20)},
        key_columns=["order_id"],
    )
    txn = sink.precommit("empty", 1)
    assert sink.commit(txn) is True
    columns = {c["name"] for c in inspect(sink.engine).get_columns(sink.table_name)}
    assert columns == {"order_id", "price", "day", "who"}
    pk = inspect(sink.engine).get_pk_constraint(sink.table_name)["constrained_columns"]
    assert pk == ["order_id"]

    rows = pd.DataFrame({"order_id": [5], "price": [Decimal("9.99")], "day": [date(2024, 2, 29)]})
    sink.write_pandas("t1", rows)
    sink.commit(sink.precommit("t1", 2))
    data = sink.read_pandas()
    assert data["order_id"].tolist() == [5]
    assert Decimal(str(data["price"][0])) == Decimal("9.99")
    assert pd.Timestamp(data["day"][0]).date() == date(2024, 2, 29)
    assert data["who"].isna().all()


def test_types_inferred_from_the_first_frame_round_trip(make_sink: SinkFactory) -> None:
    sink = make_sink()
    rows = pd.DataFrame(
        {
            "n": pd.array([1, None], dtype="Int64"),
            "flag": [True, False],
            "at": [datetime(2024, 1, 2, 3, 4, 5), datetime(2024, 6, 1)],
            "label": ["x", None],
            "ratio": [0.25, float("nan")],
        }
    )
    sink.write_pandas("t1", rows)
    sink.commit(sink.precommit("t1", 1))

    data = sink.read_pandas().sort_values("at").reset_index(drop=True)
    assert data["n"][0] == 1 and pd.isna(data["n"][1])
    assert [bool(v) for v in data["flag"]] == [True, False]
    assert pd.Timestamp(data["at"][0]) == pd.Timestamp("2024-01-02 03:04:05")
    assert data["label"][0] == "x" and pd.isna(data["label"][1])
    assert data["ratio"][0] == 0.25 and pd.isna(data["ratio"][1])


def test_key_columns_make_a_commit_replace_rows_with_the_same_key(make_sink: SinkFactory) -> None:
    sink = make_sink(key_columns=["order_id"])
    sink.commit(stage(sink, "t1", 1, 2))
    sink.write_pandas("t2", pd.DataFrame({"order_id": [2, 3], "amount": [99.0, 4.5]}))
    sink.commit(sink.precommit("t2", 2))

    data = sink.read_pandas()
    assert data["order_id"].tolist() == [1, 2, 3]
    assert data["amount"].tolist() == [1.5, 99.0, 4.5]
    assert data["customer"][0] == "c1" and pd.isna(data["customer"][1])


def test_a_transaction_may_hold_each_key_once(make_sink: SinkFactory) -> None:
    sink = make_sink(key_columns=["order_id"])
    with pytest.raises(SinkError, match="repeat a key"):
        sink.write_pandas("t1", frame(1, 1))
    sink.write_pandas("t1", frame(1))
    sink.write_pandas("t1", frame(1))
    with pytest.raises(SinkError, match=r"stages key \(1,\) more than once"):
        sink.precommit("t1", 1)
    assert "t1" not in sink.committed_txn_ids()


def test_columns_unknown_to_the_table_are_refused(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.commit(stage(sink, "t1", 1))
    with pytest.raises(SinkError, match=r"columns \['surprise'\] are not in table"):
        sink.write_pandas("t2", pd.DataFrame({"order_id": [2], "surprise": [1]}))


# -- readers never see uncommitted data --------------------------------------------------------


def test_readers_never_see_staged_rows(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.commit(stage(sink, "old", 1))

    sink.write_pandas("new", frame(2))
    assert committed_ids(sink) == [1]
    txn = sink.precommit("new", 2)
    assert committed_ids(sink) == [1]
    assert staged_row_count(sink) == 1
    with sink.engine.connect() as conn:  # a plain SQL reader of the target table
        query = text(f'SELECT order_id FROM "{sink.table_name}"')
        assert conn.execute(query).scalars().all() == [1]
    sink.commit(txn)
    assert committed_ids(sink) == [1, 2]


# -- abort -------------------------------------------------------------------------------------


def test_abort_drops_staged_rows_and_keeps_committed(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.commit(stage(sink, "kept", 1))
    doomed = stage(sink, "doomed", 2)
    sink.write_pandas("open", frame(3))
    assert sink.staged_txn_ids() == {"doomed", "open"}

    sink.abort(doomed)
    sink.abort(SinkTransaction(sink_id=sink.sink_id, txn_id="open"))

    assert committed_ids(sink) == [1]
    assert staged_row_count(sink) == 0 and sink.staged_txn_ids() == set()
    with pytest.raises(NotPrecommittedError, match="never pre-committed or it was aborted"):
        sink.commit(doomed)
    assert committed_ids(sink) == [1] and not sink.is_committed("doomed")


def test_abort_is_idempotent(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = stage(sink, "t1", 1)
    sink.abort(txn)
    sink.abort(txn)
    make_sink().abort(SinkTransaction(sink_id=sink.sink_id, txn_id="never-existed"))
    assert sink.staged_txn_ids() == set() and committed_ids(sink) == []


def test_aborting_a_committed_transaction_raises(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = stage(sink, "t1", 1)
    sink.commit(txn)
    with pytest.raises(AlreadyCommittedError, match=r"'t1'.*already committed"):
        sink.abort(txn)
    assert committed_ids(sink) == [1]


# -- transaction state rules ---------------------------------------------------------------------


def test_sealed_and_committed_transactions_refuse_writes(make_sink: SinkFactory) -> None:
    sink = make_sink()
    txn = stage(sink, "t1", 1)
    with pytest.raises(SinkTransactionError, match="pre-committed and sealed"):
        sink.write_pandas("t1", frame(2))
    sink.commit(txn)
    with pytest.raises(AlreadyCommittedError, match="write to"):
        sink.write_pandas("t1", frame(2))
    with pytest.raises(AlreadyCommittedError, match="pre-commit"):
        sink.precommit("t1", 2)
    assert committed_ids(sink) == [1] and staged_row_count(sink) == 0


def test_precommit_again_updates_the_checkpoint(make_sink: SinkFactory) -> None:
    sink = make_sink()
    first = stage(sink, "t1", 1, 2, ckpt=4)
    second = sink.precommit("t1", 5)
    assert second.checkpoint_id == 5 and second.payload == first.payload
    assert sink.commit(second) is True
    assert sink.commit(first) is False
    assert commit_records(sink) == [("t1", 2, 5)]


def test_commit_requires_a_precommitted_transaction(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.write_pandas("open", frame(1))
    with pytest.raises(NotPrecommittedError, match="carries no checkpoint id"):
        sink.commit(SinkTransaction(sink_id=sink.sink_id, txn_id="open"))
    with pytest.raises(NotPrecommittedError, match="never pre-committed"):
        sink.commit(SinkTransaction(sink_id=sink.sink_id, txn_id="open", checkpoint_id=1))
    assert committed_ids(sink) == [] and sink.committed_txn_ids() == set()
    assert staged_row_count(sink) == 1


def test_commit_refuses_a_transaction_of_another_sink(make_sink: SinkFactory) -> None:
    owner = make_sink()
    txn = stage(owner, "t1", 1)
    with pytest.raises(ForeignTransactionError, match=f"belongs to sink '{owner.sink_id}'"):
        make_sink(f"{owner.sink_id}_other").commit(txn)
    assert committed_ids(owner) == []


def test_failed_commit_rolls_back_everything(make_sink: SinkFactory) -> None:
    """Rows staged after the pre-commit (bypassing the sink) make commit fail as a whole."""
    sink = make_sink()
    txn = stage(sink, "t1", 1)
    with sink.engine.begin() as conn:
        conn.execute(
            text(
                f'INSERT INTO "{sink.staging_table_name}" (finalckpt_txn_id, order_id) '
                "VALUES ('t1', 99)"
            )
        )
    with pytest.raises(SinkTransactionError, match="pre-committed with 1 rows but 2 are staged"):
        sink.commit(txn)
    assert committed_ids(sink) == [] and not sink.is_committed("t1")
    assert staged_row_count(sink) == 2


# -- identifiers -------------------------------------------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
def test_hostile_ids_are_rejected(make_sink: SinkFactory, hostile: str) -> None:
    with pytest.raises(InvalidIdentifierError, match="invalid sink id"):
        make_sink(hostile)
    sink = make_sink()
    operations: list[Callable[[], object]] = [
        lambda: sink.staging_location(hostile),
        lambda: sink.write_pandas(hostile, frame(1)),
        lambda: sink.precommit(hostile, 1),
        lambda: sink.is_committed(hostile),
        lambda: sink.commit(SinkTransaction(sink_id=sink.sink_id, txn_id=hostile, checkpoint_id=1)),
        lambda: sink.abort(SinkTransaction(sink_id=sink.sink_id, txn_id=hostile)),
    ]
    for operation in operations:
        with pytest.raises(InvalidIdentifierError, match="invalid transaction id") as caught:
            operation()
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, StorageError)
    assert sink.committed_txn_ids() == set() and sink.staged_txn_ids() == set()


@pytest.mark.parametrize(
    "hostile_table", ["", "orders; DROP TABLE x", "s.orders", '"quoted"', "9lives", "x" * 60]
)
def test_hostile_table_and_column_names_are_rejected(db_url: str, hostile_table: str) -> None:
    with pytest.raises(InvalidIdentifierError, match="invalid table name"):
        SqlTableSink("s", db_url, hostile_table)
    with pytest.raises(InvalidIdentifierError, match="invalid column name"):
        SqlTableSink("s", db_url, "fine", columns={"a b": BigInteger})
    with pytest.raises(InvalidIdentifierError, match="reserved"):
        SqlTableSink("s", db_url, "fine", columns={"finalckpt_txn_id": BigInteger})


def test_staging_location_names_the_staging_table_without_secrets(make_sink: SinkFactory) -> None:
    sink = make_sink()
    location = sink.staging_location("t1")
    assert location.endswith(f"#{sink.table_name}__staging?finalckpt_txn_id=t1")


# -- races between processes -------------------------------------------------------------------


def _race_worker(
    action: str, url: str, table: str, txn_json: str, barrier: Any, results: Any
) -> None:
    """Run in a spawned process: wait for every contender, then commit or abort."""
    txn = SinkTransaction.model_validate_json(txn_json)
    sink = SqlTableSink(txn.sink_id, url, table)
    barrier.wait(timeout=60)
    try:
        outcome: object = sink.commit(txn) if action == "commit" else sink.abort(txn)
        results.put((action, repr(outcome)))
    except Exception as exc:
        results.put((action, type(exc).__name__))
    finally:
        sink.dispose()


def _race(url: str, table: str, txn: SinkTransaction, actions: list[str]) -> list[tuple]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(actions))
    results = context.Queue()
    processes = [
        context.Process(
            target=_race_worker,
            args=(action, url, table, txn.model_dump_json(), barrier, results),
        )
        for action in actions
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in actions]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    return sorted(outcomes)


@pytest.mark.slow
def test_processes_racing_to_commit_commit_once(
    make_sink: SinkFactory, db_url: str, table: str
) -> None:
    sink = make_sink()
    txn = stage(sink, "contended", 1, 2, 3)

    outcomes = _race(db_url, table, txn, ["commit"] * 4)

    assert outcomes == [("commit", "False")] * 3 + [("commit", "True")]
    assert committed_ids(sink) == [1, 2, 3]
    assert commit_records(sink) == [("contended", 3, 1)]
    assert staged_row_count(sink) == 0


@pytest.mark.slow
def test_commit_racing_abort_has_one_winner(
    make_sink: SinkFactory, db_url: str, table: str
) -> None:
    sink = make_sink()
    txn = stage(sink, "contended", 1, 2)

    outcomes = dict(_race(db_url, table, txn, ["abort", "commit"]))

    if outcomes["commit"] == "True":
        assert outcomes["abort"] == "AlreadyCommittedError"
        assert committed_ids(sink) == [1, 2] and sink.is_committed("contended")
    else:
        assert outcomes == {"abort": "None", "commit": "NotPrecommittedError"}
        assert committed_ids(sink) == [] and not sink.is_committed("contended")
    assert staged_row_count(sink) == 0


def test_commit_record_table_is_shared_and_keyed(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.commit(stage(sink, "t1", 1))
    pk = inspect(sink.engine).get_pk_constraint(COMMITS_TABLE)["constrained_columns"]
    assert pk == ["sink_id", "txn_id"]
    with sink.engine.connect() as conn:
        statement = select(text("count(*)")).select_from(text(COMMITS_TABLE))
        assert conn.execute(statement).scalar_one() >= 1
