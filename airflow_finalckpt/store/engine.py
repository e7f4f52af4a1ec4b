"""Engines for the coordination store: SQLite (default, WAL) and PostgreSQL.

Every coordinator transition runs in one write transaction that first locks the pipeline row, so
transitions of one pipeline are serialized across processes. SQLite gets there with
``BEGIN IMMEDIATE`` (one writer at a time, others wait up to the busy timeout); PostgreSQL with
``SELECT ... FOR UPDATE`` on the pipeline row.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool, StaticPool

SQLITE_BUSY_TIMEOUT_MS = 60_000
#: libpq's connect timeout when the URL sets none: a black-holed host fails an attempt after
#: this long instead of the operating system's TCP timeout (minutes).
PG_CONNECT_TIMEOUT_S = 10


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine with the pragmas / pool settings the coordinator relies on."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # A file database gets a fresh connection per transition (cheap, and no connection
        # outlives a fork); an in-memory one must keep its single connection or lose its data.
        in_memory = parsed.database in (None, "", ":memory:")
        kwargs.setdefault("poolclass", StaticPool if in_memory else NullPool)
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
        engine = create_engine(parsed, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, **kwargs)


def _configure_sqlite(engine: Engine) -> None:
    in_memory = engine.url.database in (None, "", ":memory:")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN IMMEDIATE instead of pysqlite's lazy BEGIN.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if not in_memory:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


def first_line(exc: BaseException) -> str:
    """The first line of a (database) error, for one-line messages."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0].strip() if lines else type(cause).__name__


def engine_kwargs(url: str) -> dict[str, Any]:
    """``make_engine`` options: a PostgreSQL connect timeout unless the URL sets one."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        return {"connect_args": {"connect_timeout": PG_CONNECT_TIMEOUT_S}}
    return {}
