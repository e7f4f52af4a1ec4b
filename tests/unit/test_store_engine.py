"""SQLite engines of the coordination store keep a pool of connections, never shared across a
fork: a child process that inherits the engine opens its own connection on first use, and the
parent's pooled connection keeps working."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.pool import QueuePool, StaticPool

from airflow_finalckpt.store.engine import _enable_wal, make_engine


def test_file_sqlite_is_pooled_and_in_memory_is_static(tmp_path: Path) -> None:
    pooled = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    memory = make_engine("sqlite://")
    try:
        assert isinstance(pooled.pool, QueuePool)
        assert isinstance(memory.pool, StaticPool)
        with pooled.connect() as conn:
            first = conn.connection.dbapi_connection
        with pooled.connect() as conn:
            assert conn.connection.dbapi_connection is first  # reused, not reopened
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        pooled.dispose()
        memory.dispose()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_uses_the_parents_connection(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'fork.db'}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (pid INTEGER)"))
            parent_conn = conn.connection.dbapi_connection
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: write through the inherited engine, report the connection
            try:
                with engine.begin() as conn:
                    conn.execute(text("INSERT INTO t VALUES (:p)"), {"p": os.getpid()})
                    same = conn.connection.dbapi_connection is parent_conn
                os.write(write, b"same" if same else b"own")
            finally:
                os._exit(0)
        os.close(write)
        answer = os.read(read, 16)
        os.close(read)
        os.waitpid(pid, 0)
        assert answer == b"own"
        with engine.begin() as conn:  # the parent's pooled connection still works
            assert conn.connection.dbapi_connection is parent_conn
            assert conn.execute(text("SELECT pid FROM t")).scalars().all() == [pid]
    finally:
        engine.dispose()


class _Cursor:
    """Answers ``PRAGMA journal_mode=WAL`` with the given errors first, then succeeds."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def execute(self, sql: str) -> None:
        assert sql == "PRAGMA journal_mode=WAL"
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


def test_switching_to_wal_retries_while_another_connection_switches_it() -> None:
    # SQLite answers "database is locked" at once, busy handler or not, when processes open a
    # new store together (seen in test_ensure_schema_from_concurrent_processes[sqlite])
    locked = sqlite3.OperationalError("database is locked")
    cursor = _Cursor(locked, locked, locked)
    _enable_wal(cursor)
    assert cursor.calls == 4


def test_switching_to_wal_does_not_retry_other_errors() -> None:
    cursor = _Cursor(sqlite3.OperationalError("disk I/O error"))
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        _enable_wal(cursor)
    assert cursor.calls == 1
