"""Engines for the coordination store: SQLite (default, WAL) and PostgreSQL.

Every coordinator transition runs in one write transaction that first locks the pipeline row, so
transitions of one pipeline are serialized across processes. SQLite gets there with
``BEGIN IMMEDIATE`` (one writer at a time, others wait up to the busy timeout); PostgreSQL with
``SELECT ... FOR UPDATE`` on the pipeline row.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import QueuePool, StaticPool
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

SQLITE_BUSY_TIMEOUT_MS = 60_000
#: Connections a SQLite engine keeps open between transitions (threads beyond it open more).
SQLITE_POOL_SIZE = 5
#: libpq's connect timeout when the URL sets none: a black-holed host fails an attempt after
#: this long instead of the operating system's TCP timeout (minutes).
PG_CONNECT_TIMEOUT_S = 10
#: libpq connection settings that bound every call on an open connection when the network to
#: the store drops (a partition answers nothing; without them a call waits for the kernel's
#: retransmission limit, ~15 minutes): data unacknowledged for ``tcp_user_timeout`` ms fails
#: the call, and keepalives find a silent peer while a call waits for its answer. The URL's
#: own values win (``?keepalives_idle=60``, ``?tcp_user_timeout=0`` to turn one off). The
#: server side gets keepalives too (``options``): a session whose client vanished behind a
#: partition would otherwise keep its transaction, and the pipeline row lock, for the
#: operating system's two hours, and every retry would wait on that lock.
PG_NETWORK_DEFAULTS: dict[str, int | str] = {
    "connect_timeout": PG_CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
    "options": "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3",
}


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine with the pragmas / pool settings the coordinator relies on."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # A file database keeps a pool of connections: opening one per transition cost a
        # connect, four pragmas and, on closing the last connection, a WAL checkpoint with
        # fsyncs (about half of an acknowledgement's time). ``_fork_guard`` makes sure no pooled
        # connection is used by another process than the one that opened it. An in-memory
        # database must keep its single connection or lose its data.
        in_memory = parsed.database in (None, "", ":memory:")
        pooled = not in_memory and "poolclass" not in kwargs
        kwargs.setdefault("poolclass", StaticPool if in_memory else QueuePool)
        if pooled:
            kwargs.setdefault("pool_size", SQLITE_POOL_SIZE)
            kwargs.setdefault("max_overflow", -1)  # more threads: more connections, no waiting
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
        if pooled:
            connect_args.setdefault("check_same_thread", False)  # the pool hands it over
        engine = create_engine(parsed, **kwargs)
        _configure_sqlite(engine)
        if pooled:
            _fork_guard(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    if parsed.get_backend_name() == "postgresql":
        connect_args = kwargs.setdefault("connect_args", {})
        for name, value in PG_NETWORK_DEFAULTS.items():
            if name not in parsed.query:
                connect_args.setdefault(name, value)
    return create_engine(parsed, **kwargs)


def _configure_sqlite(engine: Engine) -> None:
    in_memory = engine.url.database in (None, "", ":memory:")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN IMMEDIATE instead of pysqlite's lazy BEGIN.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if not in_memory:
            _enable_wal(cur)
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _enable_wal(cursor: Any) -> None:
    """Put a file database in WAL mode (persistent: a no-op once it is).

    Switching the journal mode needs an exclusive lock, and SQLite answers "database is locked"
    at once, without its busy handler, when another connection is switching it at the same
    moment: several processes opening a new store together. Retried (random exponential waits)
    for as long as the busy timeout would have waited.
    """
    for attempt in Retrying(
        retry=retry_if_exception(_is_locked),
        wait=wait_random_exponential(multiplier=0.01, max=0.5),
        stop=stop_after_delay(SQLITE_BUSY_TIMEOUT_MS / 1000),
        reraise=True,
    ):
        with attempt:
            cursor.execute("PRAGMA journal_mode=WAL")


def _fork_guard(engine: Engine) -> None:
    """A pooled connection is used only by the process that opened it: one inherited over a
    fork is dropped (never closed here: it belongs to the parent) and replaced on checkout.
    """

    @event.listens_for(engine, "connect")
    def _remember_pid(_dbapi_conn: Any, record: Any) -> None:
        record.info["pid"] = os.getpid()

    @event.listens_for(engine, "checkout")
    def _check_pid(_dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if record.info.get("pid") != os.getpid():
            record.dbapi_connection = proxy.dbapi_connection = None
            raise DisconnectionError(
                f"connection opened by process {record.info.get('pid')}, used by {os.getpid()}"
            )


def is_postgres(engine: Engine) -> bool:
    """Is the engine a PostgreSQL one (else SQLite)?"""
    return engine.dialect.name == "postgresql"


def first_line(exc: BaseException) -> str:
    """The first line of a (database) error, for one-line messages."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0].strip() if lines else type(cause).__name__
