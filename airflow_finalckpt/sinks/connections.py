"""Sinks that take their credentials from an Airflow connection, resolved when the task runs.

A sink built with ``conn_id=`` (``SqlTableSink``) or ``catalog_conn_id=``
(``IcebergTableSink``) holds only the connection's id: the DAG file, the DAG processor and the
serialized DAG never see a URL or a password. The Airflow task resolves the connection through
the Task SDK (``hooks.sink_connections``: any secrets backend, ``AIRFLOW_CONN_*``, Airflow's
connection list) and binds its fields to the sink; a submitted Spark driver gets the same fields
through its secrets file (a bound sink pickles its connection id only, never what it resolved to,
so ``code.pkl`` holds no credential), or reads ``AIRFLOW_CONN_<ID>`` from its own environment.

This module never imports Airflow: the driver side (a Spark driver without Airflow) uses it too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from airflow_finalckpt.config import store_url_from_connection
from airflow_finalckpt.core.errors import ConfigurationError

#: Connection types a sink can turn into a SQLAlchemy URL (as the coordination store's).
DATABASE_TYPES = frozenset({"postgres", "postgresql", "sqlite"})


@dataclass(frozen=True)
class ConnectionFields:
    """An Airflow connection's fields as plain values (JSON-able: the driver's secrets file)."""

    conn_id: str
    conn_type: str = ""
    host: str | None = None
    schema: str | None = None
    login: str | None = None
    password: str | None = None
    port: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, conn: Any) -> ConnectionFields:
        """The fields of a Task SDK ``Connection`` (or anything with its attributes)."""
        extra = getattr(conn, "extra_dejson", None)
        if extra is None:
            extra = _extra_dict(getattr(conn, "extra", None), conn.conn_id)
        return cls(
            conn_id=str(conn.conn_id),
            conn_type=str(conn.conn_type or ""),
            host=conn.host or None,
            schema=conn.schema or None,
            login=conn.login or None,
            password=conn.password or None,
            port=int(conn.port) if conn.port not in (None, "") else None,
            extra=dict(extra or {}),
        )

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ConnectionFields:
        """The fields of ``to_json``'s document, or of an ``AIRFLOW_CONN_*`` JSON value."""
        port = doc.get("port")
        return cls(
            conn_id=str(doc["conn_id"]),
            conn_type=str(doc.get("conn_type") or ""),
            host=doc.get("host") or None,
            schema=doc.get("schema") or None,
            login=doc.get("login") or None,
            password=doc.get("password") or None,
            port=int(port) if port not in (None, "") else None,
            extra=_extra_dict(doc.get("extra"), str(doc["conn_id"])),
        )

    def to_json(self) -> dict[str, Any]:
        """A plain JSON document (holds the password: secrets file only)."""
        return asdict(self)

    @classmethod
    def from_env(cls, conn_id: str) -> ConnectionFields | None:
        """``AIRFLOW_CONN_<CONN_ID>`` (Airflow's JSON or URI form), where Airflow is absent."""
        raw = os.environ.get(connection_env_name(conn_id), "").strip()
        if not raw:
            return None
        if raw.startswith("{"):
            try:
                doc = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ConfigurationError(
                    f"{connection_env_name(conn_id)} is not valid JSON ({exc.msg})"
                ) from None
            return cls.from_json({**doc, "conn_id": conn_id})
        return cls._from_uri(conn_id, raw)

    @classmethod
    def _from_uri(cls, conn_id: str, uri: str) -> ConnectionFields:
        parts = urlsplit(uri)
        query = dict(parse_qsl(parts.query))
        extra = _extra_dict(query.pop("__extra__", None), conn_id) or query
        # as Airflow reads it: the host keeps its case and may be a quoted path (sqlite)
        host, _, port = parts.netloc.rpartition("@")[2].partition(":")
        return cls(
            conn_id=conn_id,
            conn_type=parts.scheme.replace("-", "_"),
            host=unquote(host) or None,
            schema=unquote(parts.path.lstrip("/")) or None,
            login=unquote(parts.username or "") or None,
            password=unquote(parts.password or "") or None,
            port=int(port) if port.isdigit() else None,
            extra=dict(extra),
        )


def connection_env_name(conn_id: str) -> str:
    """Airflow's environment variable of a connection: ``AIRFLOW_CONN_<CONN_ID>``."""
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def _extra_dict(extra: Any, conn_id: str) -> dict[str, Any]:
    if extra in (None, ""):
        return {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(
                f"Airflow connection {conn_id!r}: its extra is not valid JSON ({exc.msg})"
            ) from None
    if not isinstance(extra, Mapping):
        raise ConfigurationError(f"Airflow connection {conn_id!r}: its extra must be a JSON object")
    return dict(extra)


def is_database(fields: ConnectionFields) -> bool:
    """A ``postgres`` or ``sqlite`` connection: it names a database, not catalog properties."""
    return fields.conn_type.strip().lower().replace("-", "_") in DATABASE_TYPES


def database_url(fields: ConnectionFields, who: str) -> str:
    """The SQLAlchemy URL of a ``postgres`` / ``sqlite`` connection (the conversion the
    coordination store's connection goes through); ``who`` names the sink in errors.
    """
    if not is_database(fields):
        raise ConfigurationError(
            f"{who}: Airflow connection {fields.conn_id!r} has type {fields.conn_type!r}; "
            "a database URL needs a postgres or sqlite connection"
        )
    doc = {**fields.to_json(), "extra": fields.extra}
    try:
        return store_url_from_connection(json.dumps(doc))
    except ValueError as exc:
        raise ConfigurationError(f"{who}: Airflow connection {fields.conn_id!r}: {exc}") from None


def storage_options_of(fields: ConnectionFields, who: str) -> dict[str, Any]:
    """The fsspec storage options a connection's extra names (key ``storage_options``)."""
    options = fields.extra.get("storage_options") or {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(
            f"{who}: Airflow connection {fields.conn_id!r}: extra storage_options must be a "
            "JSON object of fsspec options"
        )
    return dict(options)


def unbound_sinks(sinks: Iterable[Any]) -> list[Any]:
    """The sinks that name a connection not bound yet (``connection_id`` set, nothing bound)."""
    return [
        s
        for s in sinks
        if getattr(s, "connection_id", None) and getattr(s, "bound_connection", None) is None
    ]


def connection_secrets(sinks: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """The bound connections of ``sinks`` by id, for a submitted driver's secrets file."""
    found: dict[str, dict[str, Any]] = {}
    for sink in sinks:
        fields: ConnectionFields | None = getattr(sink, "bound_connection", None)
        if fields is not None:
            found[fields.conn_id] = fields.to_json()
    return found


def bind_from_secrets(sinks: Iterable[Any], given: Mapping[str, Any] | None) -> None:
    """On a submitted driver: bind each sink's connection from the secrets file, else from
    ``AIRFLOW_CONN_<ID>``; a connection found in neither is a clear error.
    """
    for sink in unbound_sinks(sinks):
        conn_id = str(sink.connection_id)
        doc = (given or {}).get(conn_id)
        fields = ConnectionFields.from_json(doc) if doc else ConnectionFields.from_env(conn_id)
        if fields is None:
            raise ConfigurationError(
                f"sink {sink.sink_id!r}: Airflow connection {conn_id!r} was not handed to this "
                f"Spark driver (no secrets file entry, no {connection_env_name(conn_id)}); in "
                "Kubernetes cluster mode set it from a Secret (spark.kubernetes.driver."
                f"secretKeyRef.{connection_env_name(conn_id)})"
            )
        sink.bind_connection(fields)
