"""The example DAG through real Airflow ``dag.test()``, real Spark and real sinks.

- its sinks equal an independent pandas computation;
- after a failure mid-``enrich`` a new DAG run of the same pipeline key starts no Spark session
  for the finished ``ingest`` and processes only ``enrich``'s unfinished splits (asserted from
  the runs' ``stage_run`` XCom records and the coordination store), and the sinks are still
  exactly equal.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.examples.nycflights13.data import first_days
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)

#: dags/nycflights13_pipeline.py with the test knobs (no retries, FINALCKPT_EXAMPLE_CRASH)
KNOBS_DAG = Path(__file__).resolve().parents[1] / "fixtures" / "dags" / "nycflights13_pipeline.py"
DAYS = 10

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def example(airflow_home: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # type: ignore[type-arg]
    work = tmp_path_factory.mktemp("example")
    env = {
        "AIRFLOW__FINALCKPT__STORE_URL": f"sqlite:///{work}/coordination.db",
        "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "checkpoints"),
        "FINALCKPT_EXAMPLE_INPUT": str(work / "input"),
        "FINALCKPT_EXAMPLE_OUTPUT": str(work / "output"),
        "FINALCKPT_EXAMPLE_DAYS": str(DAYS),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    target = airflow_home.dags_folder / "nycflights13_pipeline.py"
    shutil.copy(KNOBS_DAG, target)
    spec = importlib.util.spec_from_file_location("nycflights13_pipeline_test", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield {"dag": module.dag, "work": work}
    finally:
        target.unlink(missing_ok=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _xcom(run_id: str, task_id: str, key: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=run_id, key=key, task_ids=task_id, dag_ids="nycflights13_pipeline"
            )
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def _check_sinks(work: Path) -> None:
    from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink

    expected = reference_pipeline(first_days(DAYS)).windows
    parquet = ParquetTableSink("delay_windows_parquet", f"{work}/output/delay_windows")
    sql = SqlTableSink(
        "delay_windows_sql", f"sqlite:///{work}/output/delay_windows.db", "delay_windows"
    )
    assert_windows_match(parquet.read_pandas(), expected)
    assert_windows_match(sql.read_pandas(), expected)


def _coordinator(key: str) -> Any:
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.store.engine import make_engine

    return Coordinator(make_engine(os.environ["AIRFLOW__FINALCKPT__STORE_URL"]), key)


def test_crash_mid_enrich_then_new_run_of_same_key(example: dict) -> None:  # type: ignore[type-arg]
    dag, work = example["dag"], example["work"]
    key = f"nyc-{uuid.uuid4().hex[:8]}"
    os.environ["FINALCKPT_EXAMPLE_CRASH"] = "enrich:1"
    try:
        first = dag.test(run_conf={"pipeline_key": key})
    finally:
        os.environ.pop("FINALCKPT_EXAMPLE_CRASH")
    assert str(first.state).endswith("failed")
    coord = _coordinator(key)
    enrich = coord.stage("enrich")
    done_before = set(enrich.progress.finished_splits)
    assert len(done_before) == 1 and enrich.lifecycle.value == "RUNNING"
    assert coord.stage("ingest").lifecycle.value == "CLOSED"
    # nothing reached the sinks: publish never ran
    assert not (work / "output" / "delay_windows").exists() or not any(
        p.name.startswith("txn-") for p in (work / "output" / "delay_windows").iterdir()
    )

    second = dag.test(run_conf={"pipeline_key": key})
    assert str(second.state).endswith("success")
    ingest_run = _xcom(second.run_id, "ingest", "stage_run")
    assert ingest_run["status"] == "closed"
    assert ingest_run["processed_splits"] == [] and ingest_run["spark_started"] is False
    enrich_run = _xcom(second.run_id, "enrich", "stage_run")
    all_parts = set(_xcom(second.run_id, "ingest", "end_of_data")["manifest"])
    assert set(enrich_run["processed_splits"]) == all_parts - done_before
    assert enrich_run["spark_started"] is True
    _check_sinks(work)
    assert all(v.lifecycle.value == "CLOSED" for v in coord.stages().values())
