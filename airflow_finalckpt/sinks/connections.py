"""Sinks that take their credentials from an Airflow connection, resolved when the task runs.

A sink built with ``conn_id=`` (``SqlTableSink``), ``catalog_conn_id=`` (``IcebergTableSink``)
or ``storage_conn_id=`` (Parquet, Delta and Iceberg sinks: object-store credentials,
``connections.storage``) holds only the connection's id: the DAG file, the DAG processor and the
serialized DAG never see a URL or a password. The Airflow task resolves the connection through
the Task SDK (``hooks.sink_connections``: any secrets backend, ``AIRFLOW_CONN_*``, Airflow's
connection list; a storage connection through its provider's hook, ``connections.resolve``) and
binds its fields to the sink; a submitted Spark driver gets the same fields
through its secrets file (a bound sink pickles its connection id only, never what it resolved to,
so ``code.pkl`` holds no credential), or reads ``AIRFLOW_CONN_<ID>`` from its own environment.

This module never imports Airflow: the driver side (a Spark driver without Airflow) uses it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from airflow_finalckpt.connections.database import DATABASE_TYPES, is_database
from airflow_finalckpt.connections.database import database_url as _database_url
from airflow_finalckpt.connections.fields import ConnectionFields, connection_env_name
from airflow_finalckpt.core.errors import ConfigurationError

__all__ = [
    "DATABASE_TYPES",
    "SLOTS",
    "ConnectionFields",
    "bind_from_secrets",
    "connection_env_name",
    "connection_secrets",
    "database_url",
    "is_database",
    "unbound_sinks",
    "unbound_slots",
]

#: The connections a sink may name: (role, id attribute, bound attribute, bind method). The
#: main one (``conn_id`` / ``catalog_conn_id``) and the object store's (``storage_conn_id``).
SLOTS = (
    ("connection", "connection_id", "bound_connection", "bind_connection"),
    ("storage", "storage_conn_id", "bound_storage_connection", "bind_storage_connection"),
)


def database_url(fields: ConnectionFields, who: str) -> str:
    """The SQLAlchemy URL of a ``postgres`` / ``sqlite`` connection (the conversion the
    coordination store's connection goes through); ``who`` names the sink in errors.
    """
    if not is_database(fields):
        raise ConfigurationError(
            f"{who}: Airflow connection {fields.conn_id!r} has type {fields.conn_type!r}; "
            "a database URL needs a postgres or sqlite connection"
        )
    try:
        return _database_url(fields)
    except ValueError as exc:
        raise ConfigurationError(f"{who}: Airflow connection {fields.conn_id!r}: {exc}") from None


def unbound_slots(sink: Any) -> Iterator[tuple[str, str, str]]:
    """(role, connection id, bind method) of each connection ``sink`` names, not bound yet."""
    for role, id_attr, bound_attr, bind in SLOTS:
        conn_id = getattr(sink, id_attr, None)
        if conn_id and getattr(sink, bound_attr, None) is None:
            yield role, str(conn_id), bind


def unbound_sinks(sinks: Iterable[Any]) -> list[Any]:
    """The sinks that name a connection not bound yet."""
    return [s for s in sinks if next(unbound_slots(s), None) is not None]


def _secret_key(role: str, conn_id: str) -> str:
    # a storage connection is shipped as its provider resolved it: kept apart from the same id
    # used raw (an aws connection for a Glue catalog and for S3)
    return conn_id if role == "connection" else f"{role}:{conn_id}"


def connection_secrets(sinks: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """The bound connections of ``sinks`` by id, for a submitted driver's secrets file."""
    found: dict[str, dict[str, Any]] = {}
    for sink in sinks:
        for role, _id_attr, bound_attr, _bind in SLOTS:
            fields: ConnectionFields | None = getattr(sink, bound_attr, None)
            if fields is not None:
                found[_secret_key(role, fields.conn_id)] = fields.to_json()
    return found


def bind_from_secrets(sinks: Iterable[Any], given: Mapping[str, Any] | None) -> None:
    """On a submitted driver: bind each sink's connections from the secrets file, else from
    ``AIRFLOW_CONN_<ID>``; a connection found in neither is a clear error.
    """
    for sink in sinks:
        for role, conn_id, bind in list(unbound_slots(sink)):
            doc = (given or {}).get(_secret_key(role, conn_id))
            fields = ConnectionFields.from_json(doc) if doc else ConnectionFields.from_env(conn_id)
            if fields is None:
                raise ConfigurationError(
                    f"sink {sink.sink_id!r}: Airflow connection {conn_id!r} was not handed to "
                    f"this Spark driver (no secrets file entry, no "
                    f"{connection_env_name(conn_id)}); in Kubernetes cluster mode set it from a "
                    f"Secret (spark.kubernetes.driver.secretKeyRef.{connection_env_name(conn_id)})"
                )
            getattr(sink, bind)(fields)
