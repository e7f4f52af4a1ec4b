"""A planted password in the store URL and in a sink's URL is in none of the places Airflow
keeps or shows after a real ``dag.test()`` run of a stage (in-process Spark, PostgreSQL store
and sink): the task log, the XComs, the trigger rows (decrypted), the task instance's
``next_kwargs``, and every file of the checkpoint storage (issue 27; the standalone
spark-submit path: tests/cluster/test_no_secret_in_clear_cluster.py; the command lines the
launcher builds: test_driver_secrets.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from airflow_finalckpt.hooks import finalckpt as hook_module
from tests.planted_secret import files_holding

PLANTED = "Planted-Pw-93ad1e"

DAG_SOURCE = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import SqlTableSink


def rows(ctx):
    return ctx.spark.createDataFrame([(s, 1) for s in ctx.splits], "split string, n long")


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(
        task_id="load",
        transform=rows,
        splits=["a", "b"],
        sinks=[SqlTableSink("planted_sql", SINK_URL, "planted_rows")],
    )
"""


def test_a_planted_password_is_nowhere_after_a_real_run(
    airflow_home: Any,
    pg_store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    write_dag: Callable[..., Any],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    url = make_url(pg_store_url).set(password=PLANTED).render_as_string(hide_password=False)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", url)  # trust auth: any password works
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    hook_module.dispose_engines()
    dag_id = f"planted_{uuid.uuid4().hex[:8]}"
    dag = write_dag(DAG_SOURCE, DAG_ID=dag_id, SINK_URL=url)
    try:
        dag_run = dag.test()
    finally:
        hook_module.dispose_engines()
    assert str(dag_run.state).endswith("success")

    # dag.test() runs the task in this process: its log goes to stdout and stdlib logging
    captured = capfd.readouterr()
    task_log = captured.out + "\n" + captured.err + "\n" + caplog.text
    assert "finalckpt coordination store postgresql+psycopg://postgres:***@" in task_log
    assert PLANTED not in task_log
    assert files_holding(airflow_home.logs_folder, PLANTED) == []
    assert files_holding(tmp_path / "checkpoints", PLANTED) == []
    with create_session() as session:
        xcoms = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id)).all()
        assert {x.key for x in xcoms} >= {"end_of_data", "stage_run"}
        assert PLANTED not in json.dumps([XComModel.deserialize_value(x) for x in xcoms])
        triggers = session.scalars(select(Trigger)).all()
        assert PLANTED not in json.dumps([t.kwargs for t in triggers], default=str)
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag_id)).all()
        assert PLANTED not in json.dumps([ti.next_kwargs for ti in tis], default=str)
    # the sink did write through the planted URL: the run was real
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM planted_rows")).scalar() == 2
    engine.dispose()
