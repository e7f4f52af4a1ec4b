"""A continuation on purpose still continues (issue 38): a DAG run whose conf names another
run's default pipeline key works on that pipeline (its closed stage re-publishes, no Spark job,
no new Asset event), although the re-created-run rule now gives DAG runs without a key a
pipeline of their own. Real ``dag.test()`` with a Parquet sink on a local SQLite store.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

pytestmark = pytest.mark.slow

ONE_STAGE_DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink


def rows(ctx):
    return ctx.spark.createDataFrame([(s,) for s in ctx.splits], "k string")


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(
        task_id="publish",
        transform=rows,
        splits=["s1", "s2", "s3"],
        sinks=[ParquetTableSink("out", OUT_DIR)],
        retries=0,
    )
"""


def test_a_run_naming_another_runs_default_key_in_its_conf_continues_that_pipeline(
    airflow_home: Any,
    spark: Any,
    local_store: Path,
    write_dag: Callable[..., Any],
    capfd: pytest.CaptureFixture[str],
) -> None:
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.core.pipeline_keys import default_pipeline_key
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.repository import pipeline_of_dag_run

    out = local_store / "out"
    dag = write_dag(ONE_STAGE_DAG, DAG_ID=f"conf_key_{uuid.uuid4().hex[:8]}", OUT_DIR=str(out))
    first = dag.test()
    assert str(first.state).endswith("success")
    engine = make_engine(f"sqlite:///{local_store}/coordination.db")
    key = pipeline_of_dag_run(engine, dag.dag_id, first.run_id)
    assert key == default_pipeline_key(dag.dag_id, first.run_id)

    capfd.readouterr()
    again = dag.test(run_conf={"pipeline_key": key})
    log = "".join(capfd.readouterr())
    assert str(again.state).endswith("success"), log[-3000:]
    assert again.run_id != first.run_id
    assert pipeline_of_dag_run(engine, dag.dag_id, again.run_id) == key
    assert Coordinator(engine, key).dag_runs() == [
        (dag.dag_id, first.run_id),
        (dag.dag_id, again.run_id),
    ]
    assert "no Spark job submitted, re-publishing its end_of_data" in log
    assert "deleted and created again" not in log
    assert sorted(pd.read_parquet(out)["k"]) == ["s1", "s2", "s3"]  # committed once
    engine.dispose()
