"""SQLite engines of the coordination store keep a pool of connections, never shared across a
fork: a child process that inherits the engine opens its own connection on first use, and the
parent's pooled connection keeps working."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.pool import QueuePool, StaticPool

from airflow_finalckpt.store.engine import make_engine


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
