"""The incremental example (``dags/nycflights13_incremental.py``) through ``dag.test()``: a
writer appends days of flights to an Iceberg table between runs; each run publishes the rollup
of the days appended since the last committed run; the rollup table equals pandas' rollup of
every appended day, each day once.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_finalckpt.examples.nycflights13.data import prepare_inputs
from airflow_finalckpt.sinks import ParquetTableSink
from tests.extras import import_extra

pytestmark = pytest.mark.slow
import_extra("pyiceberg", "lakehouse")

DAYS = [dt.date(2013, 1, 1), dt.date(2013, 1, 2), dt.date(2013, 1, 3)]


def test_each_run_rolls_up_the_days_appended_since_the_last(
    airflow_home: Any, local_store: Path, tmp_path: Path
) -> None:
    from airflow_finalckpt.examples.nycflights13.incremental import (
        KEYS,
        append_days,
        build_incremental_dag,
        reference_rollup,
    )

    inputs, warehouse, output = tmp_path / "input", tmp_path / "wh", tmp_path / "out"
    prepare_inputs(inputs, days=DAYS)
    dag_id = f"incremental_{uuid.uuid4().hex[:8]}"
    settings = {"warehouse": str(warehouse), "output_dir": str(output)}
    dag_file = airflow_home.dags_folder / f"{dag_id}.py"
    dag_file.write_text(
        "from airflow_finalckpt.examples.nycflights13.incremental import build_incremental_dag\n"
        f"dag = build_incremental_dag({dag_id!r}, **{settings!r})\n"
    )
    dag = build_incremental_dag(dag_id, **settings)
    try:
        append_days(str(warehouse), str(inputs), DAYS[:2])
        first = dag.test(logical_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC))
        assert str(first.state).endswith("success")
        append_days(str(warehouse), str(inputs), DAYS[2:])  # the writer, between runs
        second = dag.test(logical_date=dt.datetime(2026, 11, 2, tzinfo=dt.UTC))
        assert str(second.state).endswith("success")
    finally:
        dag_file.unlink(missing_ok=True)
    actual = ParquetTableSink("daily_rollup", str(output / "daily_rollup")).read_pandas()
    expected = reference_rollup(str(inputs), DAYS)
    columns = [*KEYS, "flights", "cancelled", "mean_dep_delay"]
    actual = actual[columns].sort_values(list(KEYS)).reset_index(drop=True)
    expected = expected[columns].sort_values(list(KEYS)).reset_index(drop=True)
    assert len(actual) == len(expected) > 0  # each day once
    pd.testing.assert_frame_equal(actual, expected, check_dtype=False, rtol=1e-9)


def test_the_dag_file_reads_the_feed_incrementally(airflow_home: Any) -> None:
    import importlib.util

    from airflow_finalckpt.sources import IcebergAppends

    path = Path(__file__).resolve().parents[2] / "dags" / "nycflights13_incremental.py"
    spec = importlib.util.spec_from_file_location("nycflights13_incremental_file", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (task,) = module.dag.tasks
    assert module.dag.dag_id == "nycflights13_incremental" and module.dag.max_active_runs == 1
    assert (
        isinstance(task.splits, IcebergAppends) and task.splits.table == "nycflights13.flights_feed"
    )
