"""An Airflow connection's fields as plain, JSON-able values (a Spark driver's secrets file).

``parse_connection`` reads a connection in Airflow's env form (``AIRFLOW_CONN_<ID>``: a URI or
a JSON object) with Airflow's own parser (``airflow.sdk.definitions.connection.Connection``)
where Airflow is installed, so the store, the sinks and Airflow agree on every field; a Spark
driver or a CLI without Airflow parses the same forms with the fallback below.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from airflow_finalckpt.core.errors import ConfigurationError


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

    def replace(self, **changes: Any) -> ConnectionFields:
        """A copy with some fields changed (a provider hook's resolved credentials)."""
        return ConnectionFields(**{**asdict(self), **changes})

    @classmethod
    def from_env(cls, conn_id: str) -> ConnectionFields | None:
        """``AIRFLOW_CONN_<CONN_ID>`` (Airflow's JSON or URI form); None when unset."""
        raw = os.environ.get(connection_env_name(conn_id), "").strip()
        if not raw:
            return None
        try:
            return parse_connection(conn_id, raw)
        except ValueError as exc:
            raise ConfigurationError(f"{connection_env_name(conn_id)}: {exc}") from None


def connection_env_name(conn_id: str) -> str:
    """Airflow's environment variable of a connection: ``AIRFLOW_CONN_<CONN_ID>``."""
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def parse_connection(conn_id: str, raw: str) -> ConnectionFields:
    """A connection in Airflow's env form (URI or JSON object), parsed by Airflow's
    ``Connection.from_uri`` / ``from_json`` where Airflow is installed.

    Raises ValueError naming what is wrong (never the password).
    """
    text = raw.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"JSON connection is not valid JSON ({exc.msg})") from None
        if not isinstance(doc, dict):
            raise ValueError("JSON connection must be an object")
        port = doc.get("port")
        if port not in (None, "") and not str(port).strip().isdigit():
            raise ValueError(f"connection port {port!r} is not a number")
        _extra_dict(doc.get("extra"), conn_id)  # our message for a bad extra, not Airflow's
        airflow_conn = _airflow_connection(conn_id, text, is_json=True)
        if airflow_conn is None:
            return ConnectionFields.from_json({**doc, "conn_id": conn_id})
        return ConnectionFields.of(airflow_conn)
    if "://" not in text:
        raise ValueError("connection is neither a URI nor a JSON object")
    airflow_conn = _airflow_connection(conn_id, text, is_json=False)
    if airflow_conn is None:
        return _from_uri(conn_id, text)
    return ConnectionFields.of(airflow_conn)


def _airflow_connection(conn_id: str, text: str, *, is_json: bool) -> Any | None:
    """Airflow's ``Connection`` parsed from ``text``; None where Airflow is not installed."""
    try:
        from airflow.sdk.definitions.connection import Connection
    except ImportError:
        return None
    try:
        if is_json:
            return Connection.from_json(text, conn_id=conn_id)
        return Connection.from_uri(text, conn_id=conn_id)
    except Exception as exc:  # AirflowException, ValueError: the message holds no password
        raise ValueError(f"connection cannot be parsed ({type(exc).__name__})") from None


def _from_uri(conn_id: str, uri: str) -> ConnectionFields:
    """The fallback of Airflow's ``Connection.from_uri`` where Airflow is absent."""
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    extra = _extra_dict(query.pop("__extra__", None), conn_id) or query
    # as Airflow reads it: the host may be a quoted path (sqlite), then it keeps its case
    host, _, port = parts.netloc.rpartition("@")[2].partition(":")
    host = unquote(host)
    return ConnectionFields(
        conn_id=conn_id,
        conn_type=parts.scheme.replace("-", "_").replace("postgresql", "postgres"),
        host=(host if "/" in host else host.lower()) or None,
        schema=unquote(parts.path[1:]) or None,
        login=unquote(parts.username or "") or None,
        password=unquote(parts.password or "") or None,
        port=int(port) if port.isdigit() else None,
        extra=dict(extra),
    )


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
