"""The SQLAlchemy URL of a ``postgres`` / ``sqlite`` Airflow connection.

One conversion for the coordination store (``finalckpt_default``, ``FinalCkptHook``), SQL sinks
(``conn_id``) and SQL Iceberg catalogs (``catalog_conn_id``). The connection is parsed by
Airflow's ``Connection`` API (``fields.parse_connection``); the URL is built here rather than by
the postgres provider's ``PostgresHook.sqlalchemy_url``, which is not a dependency, names
psycopg2 unless told otherwise, and puts every extra (``cursor``, ``iam``...) into the URL
query, where psycopg refuses them: only libpq parameters go there.
"""

from __future__ import annotations

from typing import Any

from airflow_finalckpt.connections.fields import ConnectionFields, parse_connection

#: Connection types that name a database the package can use.
DATABASE_TYPES = frozenset({"postgres", "postgresql", "sqlite"})

#: Connection extras that are libpq connection parameters, so they may go into the URL query.
#: Other Airflow extras (``cursor``, ``iam``...) would make psycopg refuse to connect.
LIBPQ_QUERY_PARAMS = frozenset(
    {
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "connect_timeout",
        "application_name",
        "options",
        "target_session_attrs",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
    }
)


def normalized_type(conn_type: Any) -> str:
    """``postgres`` / ``postgresql`` -> ``postgres``; dashes as Airflow writes them."""
    kind = str(conn_type or "").strip().lower().replace("-", "_")
    return "postgres" if kind in ("postgresql", "postgresql+psycopg") else kind


def is_database(fields: ConnectionFields) -> bool:
    """A ``postgres`` or ``sqlite`` connection: it names a database."""
    return normalized_type(fields.conn_type) in DATABASE_TYPES


def database_url(fields: ConnectionFields) -> str:
    """The SQLAlchemy URL (psycopg 3 for PostgreSQL) of a ``postgres`` / ``sqlite`` connection.

    Raises ValueError naming the problem (never the password).
    """
    from sqlalchemy.engine import URL

    kind = normalized_type(fields.conn_type)
    if kind == "sqlite":
        # Airflow's SqliteHook keeps the file path in ``host``; a URI may put it in the path.
        path = fields.host or fields.schema
        if not path:
            raise ValueError("sqlite connection names no database file (set host)")
        return URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)
    if kind != "postgres":
        kind_text = f"connection type {fields.conn_type!r}"
        raise ValueError(f"{kind_text} cannot hold the coordination store; use postgres or sqlite")
    query = {str(k): str(v) for k, v in fields.extra.items() if k in LIBPQ_QUERY_PARAMS}
    url = URL.create(
        "postgresql+psycopg",
        username=fields.login,
        password=fields.password,
        host=fields.host,
        port=fields.port,
        database=fields.schema,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def store_url_from_connection(raw: str, conn_id: str = "finalckpt_default") -> str:
    """An Airflow connection in its env form (URI or JSON) as a SQLAlchemy URL string."""
    return database_url(parse_connection(conn_id, raw))
