"""A DAG with no credential in its code publishes to SQL and Iceberg through Airflow connections
(issue 28): a real ``dag.test()`` whose sinks name connections defined in ``AIRFLOW_CONN_*``
(JSON form) that the task resolves when it runs. The rows land in PostgreSQL and in an Iceberg
table whose SQL catalog is in PostgreSQL; the password planted in the connection (PostgreSQL
trusts the test's connections, so any password works) is nowhere in the task log or the XComs.
A connection that does not exist fails the task with one line naming it and the sink."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.planted_secret import files_holding

PLANTED = "Conn-Planted-Pw-5c1e"

DAG_SOURCE = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import IcebergTableSink, SqlTableSink


def rows(ctx):
    return ctx.spark.createDataFrame([(s, 1) for s in ctx.splits], "split string, n long")


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(
        task_id="load",
        transform=rows,
        splits=["a", "b", "c"],
        sinks=[
            SqlTableSink("conn_sql", table=TABLE, conn_id=SQL_CONN),
            IcebergTableSink(
                "conn_ice", ICEBERG_TABLE, warehouse=WAREHOUSE, catalog_conn_id=CATALOG_CONN
            ),
        ],
    )
"""


def _pg_connection(pg_url: str) -> str:
    url = make_url(pg_url)
    return json.dumps(
        {
            "conn_type": "postgres",
            "host": url.host,
            "port": url.port or 5432,
            "login": url.username,
            "password": PLANTED,
            "schema": url.database,
        }
    )


@pytest.fixture
def store(local_store: Path) -> Path:
    return local_store


def test_a_dag_without_credentials_publishes_through_connections(
    airflow_home: Any,
    pg_url: str,
    store: Path,
    monkeypatch: pytest.MonkeyPatch,
    write_dag: Callable[..., Any],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    suffix = uuid.uuid4().hex[:8]
    monkeypatch.setenv("AIRFLOW_CONN_ANALYTICS_DB", _pg_connection(pg_url))
    monkeypatch.setenv("AIRFLOW_CONN_ICEBERG_CATALOG", _pg_connection(pg_url))
    dag_id = f"conn_sinks_{suffix}"
    params = {
        "DAG_ID": dag_id,
        "TABLE": f"conn_rows_{suffix}",
        "SQL_CONN": "analytics_db",
        "ICEBERG_TABLE": f"conn_{suffix}.rows",
        "WAREHOUSE": str(store / "warehouse"),
        "CATALOG_CONN": "iceberg_catalog",
    }
    dag = write_dag(DAG_SOURCE, **params)
    # the DAG file holds connection ids only, and so does the parsed DAG's sink
    source = Path(dag.fileloc).read_text()
    assert PLANTED not in source and "postgresql" not in source
    sql_sink = dag.get_task("load").sinks[0]
    assert sql_sink.asset_uri == f"sql://analytics_db/conn_rows_{suffix}"

    dag_run = dag.test()
    assert str(dag_run.state).endswith("success")

    captured = capfd.readouterr()
    task_log = captured.out + "\n" + captured.err + "\n" + caplog.text
    assert "sink conn_sql: connection analytics_db resolved" in task_log
    # the URL built from the connection is registered with Airflow's secrets masker as a whole
    # (Airflow itself masks only the connection's password): whatever prints it shows ***
    from airflow.sdk._shared.secrets_masker import redact

    resolved = make_url(pg_url).set(drivername="postgresql+psycopg", password=PLANTED)
    masked = str(redact(resolved.render_as_string(hide_password=False)))
    assert PLANTED not in masked and str(resolved.host) not in masked, masked
    assert PLANTED not in task_log
    assert PLANTED not in "".join(
        p.read_text(errors="replace") for p in airflow_home.logs_folder.rglob("*") if p.is_file()
    )
    with create_session() as session:
        xcoms = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id)).all()
        assert {x.key for x in xcoms} >= {"end_of_data", "stage_run"}
        assert PLANTED not in json.dumps([XComModel.deserialize_value(x) for x in xcoms])

    engine = create_engine(pg_url)
    with engine.connect() as conn:
        got = conn.execute(text(f"SELECT split, n FROM conn_rows_{suffix} ORDER BY split")).all()
    engine.dispose()
    assert [tuple(r) for r in got] == [("a", 1), ("b", 1), ("c", 1)]

    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(
        "finalckpt",
        type="sql",
        uri=make_url(pg_url).set(drivername="postgresql+psycopg").render_as_string(False),
    )
    table = catalog.load_table(f"conn_{suffix}.rows").scan().to_arrow().to_pylist()
    assert sorted((r["split"], r["n"]) for r in table) == [("a", 1), ("b", 1), ("c", 1)]


def test_a_missing_connection_fails_the_task_naming_it_and_the_sink(
    airflow_home: Any,
    store: Path,
    write_dag: Callable[..., Any],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    dag = write_dag(
        DAG_SOURCE,
        DAG_ID=f"conn_missing_{suffix}",
        TABLE=f"conn_rows_{suffix}",
        SQL_CONN="no_such_db",
        ICEBERG_TABLE=f"conn_{suffix}.rows",
        WAREHOUSE=str(store / "warehouse"),
        CATALOG_CONN="no_such_catalog",
    )  # parsing needs no connection
    dag_run = dag.test()
    assert str(dag_run.state).endswith("failed")
    captured = capfd.readouterr()
    task_log = captured.out + "\n" + captured.err + "\n" + caplog.text
    assert "sink 'conn_sql': Airflow connection 'no_such_db' is not defined; create it" in task_log
    assert not (store / "warehouse").exists()  # nothing was written


PARQUET_DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink


def rows(ctx):
    return ctx.spark.createDataFrame([(s, 1) for s in ctx.splits], "split string, n long")


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(
        task_id="load",
        transform=rows,
        splits=["a", "b"],
        sinks=[ParquetTableSink("files", TABLE, storage_conn_id=STORAGE_CONN)],
    )
"""


def test_checkpoint_storage_and_a_parquet_sink_take_their_options_from_connections(
    airflow_home: Any,
    store: Path,
    monkeypatch: pytest.MonkeyPatch,
    write_dag: Callable[..., Any],
    capfd: pytest.CaptureFixture[str],
) -> None:
    """storage_conn_id through a real stage task: the checkpoint storage is ``dir://`` over a
    local directory that only the connection's options name (without them the storage cannot
    be opened), and the Parquet sink's filesystem options come from another connection."""
    import pyarrow.dataset as ds

    suffix = uuid.uuid4().hex[:8]
    bucket = store / "bucket"
    bucket.mkdir()
    options = {"path": str(bucket), "target_protocol": "file", "secret_hint": PLANTED}
    monkeypatch.setenv(
        "AIRFLOW_CONN_CKPT_FS",
        json.dumps({"conn_type": "generic", "extra": {"storage_options": options}}),
    )
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", "dir://checkpoints")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_CONN_ID", "ckpt_fs")
    sink_options = {"storage_options": {"auto_mkdir": True, "token": PLANTED}}
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_FS", json.dumps({"conn_type": "generic", "extra": sink_options})
    )
    table = store / "table"
    dag = write_dag(
        PARQUET_DAG, DAG_ID=f"conn_storage_{suffix}", TABLE=str(table), STORAGE_CONN="lake_fs"
    )

    dag_run = dag.test()

    assert str(dag_run.state).endswith("success")
    assert list((bucket / "checkpoints").rglob("_metadata")), "no checkpoint under the bucket"
    got = ds.dataset(str(table), format="parquet", exclude_invalid_files=True).to_table()
    assert sorted(got.column("split").to_pylist()) == ["a", "b"]
    captured = capfd.readouterr()
    assert "sink files: connection lake_fs resolved" in captured.out + captured.err
    assert PLANTED not in captured.out + captured.err
    # the connections' options are in no log file, checkpoint file, XCom or trigger row
    from airflow.models.trigger import Trigger
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    for root in (airflow_home.logs_folder, bucket):
        assert files_holding(root, PLANTED) == []
    with create_session() as session:
        xcoms = session.scalars(select(XComModel).where(XComModel.dag_id == dag.dag_id)).all()
        assert PLANTED not in json.dumps([XComModel.deserialize_value(x) for x in xcoms])
        triggers = session.scalars(select(Trigger)).all()
        assert PLANTED not in json.dumps([t.kwargs for t in triggers], default=str)
