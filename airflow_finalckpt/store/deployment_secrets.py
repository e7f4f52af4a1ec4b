"""The deployment's generated secrets (``finalckpt_deployment_secrets``, issue 37).

Without ``[finalckpt] code_signing_key`` the code and job spec a task hands a Spark driver
are sealed with a random key generated once per deployment and kept here: every worker and
every driver reaches the store (workers share no local disk, and a driver coordinates through
the store anyway), and only the deployment holds the store's credentials. The checkpoint
storage, which a shared bucket may expose to others, never holds it.
"""

from __future__ import annotations

import secrets
import time

from sqlalchemy import Engine, select

from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store import schema as t

#: The row of the generated code signing key.
CODE_SIGNING_KEY = "code_signing_key"
_table = t.deployment_secrets


def stored_secret(engine: Engine, name: str) -> str | None:
    """The generated secret ``name``; None before anyone generated it (a read, no write)."""
    with engine.connect() as conn:
        value = conn.execute(select(_table.c.value).where(_table.c.name == name)).scalar()
    return None if value is None else str(value)


def ensure_secret(engine: Engine, name: str) -> str:
    """The generated secret ``name``, created (256 random bits) by the first caller: concurrent
    first callers on several workers all get the one value that won the insert.
    """
    found = stored_secret(engine, name)
    if found is not None:
        return found
    with engine.begin() as conn:
        fresh = {"name": name, "value": secrets.token_urlsafe(32), "created_at": time.time()}
        r.insert_ignore(conn, _table, fresh)
        value = conn.execute(select(_table.c.value).where(_table.c.name == name)).scalar_one()
    return str(value)
