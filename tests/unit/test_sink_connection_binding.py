"""The driver side of sinks that take their credentials from an Airflow connection (no Airflow
here, as in a submitted Spark driver): a bound sink pickles its connection id only, so
``code.pkl`` holds no password; the driver binds it again from its secrets file or from
``AIRFLOW_CONN_<ID>``; bad connections are one clear error naming the sink and the connection.
The task side with a real Airflow: tests/airflow/test_sink_connections.py."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from urllib.parse import quote

import pytest

from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.sinks import IcebergTableSink, SqlTableSink
from airflow_finalckpt.sinks.connections import (
    ConnectionFields,
    bind_from_secrets,
    connection_secrets,
    unbound_sinks,
)

PLANTED = "Unit-Planted-Pw-77"


def _pg_fields(conn_id: str = "analytics_db") -> ConnectionFields:
    return ConnectionFields(
        conn_id=conn_id,
        conn_type="postgres",
        host="db.example",
        port=5433,
        login="app",
        password=PLANTED,
        schema="reports",
        extra={"sslmode": "require", "cursor": "dictcursor"},
    )


def test_a_conn_id_sink_is_bound_when_the_task_runs_and_pickles_its_id_only() -> None:
    sink = SqlTableSink("out", table="rows", conn_id="analytics_db")
    assert unbound_sinks([sink]) == [sink]
    assert sink.asset_uri == "sql://analytics_db/rows"
    with pytest.raises(ConfigurationError, match="'analytics_db' is resolved when the stage task"):
        _ = sink.engine
    sink.bind_connection(_pg_fields())
    assert sink.engine.url.render_as_string(hide_password=False) == (
        f"postgresql+psycopg://app:{PLANTED}@db.example:5433/reports?sslmode=require"
    )
    assert sink.asset_uri == "postgres://db.example:5433/reports/public/rows"
    assert PLANTED not in repr(sink)

    blob = pickle.dumps([sink])
    assert PLANTED.encode() not in blob and b"db.example" not in blob
    (shipped,) = pickle.loads(blob)
    assert unbound_sinks([shipped]) == [shipped]
    secrets = json.loads(json.dumps({"sink_connections": connection_secrets([sink])}))
    bind_from_secrets([shipped], secrets["sink_connections"])
    assert shipped.engine.url == sink.engine.url


def test_the_driver_reads_an_airflow_conn_variable_when_the_secrets_file_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = pickle.loads(pickle.dumps(SqlTableSink("out", table="rows", conn_id="local_db")))
    with pytest.raises(ConfigurationError, match="no AIRFLOW_CONN_LOCAL_DB"):
        bind_from_secrets([sink], {})
    # Airflow's URI form of a sqlite connection: the file's path, quoted, as the host
    monkeypatch.setenv("AIRFLOW_CONN_LOCAL_DB", "sqlite://" + quote(str(tmp_path / "out.db"), ""))
    bind_from_secrets([sink], None)
    assert sink.engine.url.database == str(tmp_path / "out.db")


def test_an_iceberg_catalog_from_connections(tmp_path: Path) -> None:
    sink = IcebergTableSink("ice", "ns.rows", warehouse=str(tmp_path), catalog_conn_id="cat")
    with pytest.raises(ConfigurationError, match="'cat' is resolved when the stage task runs"):
        sink._catalog()
    sink.bind_connection(_pg_fields("cat"))
    assert sink._properties == {
        "type": "sql",
        "uri": f"postgresql+psycopg://app:{PLANTED}@db.example:5433/reports?sslmode=require",
        "warehouse": str(tmp_path),
    }
    blob = pickle.dumps(sink)
    assert PLANTED.encode() not in blob

    rest = ConnectionFields(
        conn_id="cat",
        conn_type="generic",
        host="https://catalog.example/api",
        login="client",
        password=PLANTED,
        extra={"type": "rest", "storage_options": {"key": "k1", "secret": PLANTED}},
    )
    other = IcebergTableSink(
        "ice", "ns.rows", catalog_conn_id="cat", storage_options={"key": "mine"}
    )
    other.bind_connection(rest)
    assert other._properties == {
        "type": "rest",
        "uri": "https://catalog.example/api",
        "credential": f"client:{PLANTED}",
    }
    assert other.storage_options == {"key": "mine", "secret": PLANTED}
    assert PLANTED.encode() not in pickle.dumps(other)


def test_bad_arguments_and_connections_are_one_clear_error() -> None:
    with pytest.raises(ConfigurationError, match=r"pass either url= .* or conn_id="):
        SqlTableSink("out", "sqlite:////tmp/x.db", "rows", conn_id="db")
    with pytest.raises(ConfigurationError, match=r"pass either url= .* or conn_id="):
        SqlTableSink("out", table="rows")
    with pytest.raises(ConfigurationError, match="argument table is required"):
        SqlTableSink("out", conn_id="db")
    with pytest.raises(ConfigurationError, match="either catalog= or catalog_conn_id="):
        IcebergTableSink("ice", "ns.t", catalog="sqlite:////tmp/c.db", catalog_conn_id="cat")
    sink = SqlTableSink("out", table="rows", conn_id="web")
    with pytest.raises(
        ConfigurationError,
        match="sink 'out': Airflow connection 'web' has type 'http'; a database URL needs",
    ):
        sink.bind_connection(ConnectionFields(conn_id="web", conn_type="http", host="x"))
    with pytest.raises(ConfigurationError, match="sink 'out': Airflow connection 'lite': sqlite"):
        sink.bind_connection(ConnectionFields(conn_id="lite", conn_type="sqlite"))
