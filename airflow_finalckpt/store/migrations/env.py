"""Alembic environment of the coordination store.

Only ``airflow_finalckpt.store.migrate`` runs it: it opens the transaction (and, on PostgreSQL,
takes the advisory lock), passes the connection in ``config.attributes["connection"]`` and
commits afterwards. Alembic sees a connection that is already in a transaction and runs every
revision inside it, so an upgrade is all-or-nothing on both SQLite and PostgreSQL.
"""

from __future__ import annotations

from alembic import context

from airflow_finalckpt.store.migrate import VERSION_TABLE, include_store_object
from airflow_finalckpt.store.schema import metadata


def run_migrations() -> None:
    """Run the migrations on the connection ``store.migrate`` opened (never online/offline
    by the alembic command line).
    """
    connection = context.config.attributes.get("connection")
    if connection is None or context.is_offline_mode():
        raise RuntimeError(
            "the finalckpt migrations run through airflow_finalckpt.store.migrate "
            "(or `finalckpt db upgrade`), not through the alembic command line"
        )
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_name=include_store_object,
        # SQLite cannot ALTER most things; future revisions use batch mode there.
        render_as_batch=connection.dialect.name == "sqlite",
        # migrate.py always passes a connection inside its own transaction, which Alembic then
        # leaves alone. Should a caller not, SQLite DDL is transactional all the same: one
        # transaction around all revisions instead of none (Alembic's SQLite default).
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
