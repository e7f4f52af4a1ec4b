"""The branching example DAG (two sources fanning in to enrich, two branches of different
length after it) through real Airflow ``dag.test()``, real Spark and real sinks, run serially:
every output (both delay-window sinks and the carrier_daily table) equals an independent pandas
computation, and every stage closed on a checkpoint at or after its finish.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.examples.nycflights13.branching import ORIGINS, STAGE_IDS
from airflow_finalckpt.examples.nycflights13.data import first_days
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_carrier_daily_match,
    assert_windows_match,
    reference_carrier_daily,
    reference_pipeline,
)

pytestmark = pytest.mark.slow

DAYS = 3
DAG_SOURCE = """
from airflow_finalckpt.examples.nycflights13.branching import build_branching_dag

dag = build_branching_dag(
    DAG_ID,
    input_dir=INPUT,
    output_dir=OUTPUT,
    days=DAYS,
    retries=0,
    # several batches per stage: carrier_daily's per-batch aggregate must still be exact
    batch_sizes={"ingest": 1, "weather": 2, "enrich": 2, "carrier_daily": 1},
)
"""


def test_branching_dag_publishes_every_output_exactly_once(
    write_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_finalckpt.core.coordinator import Coordinator
    from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
    from airflow_finalckpt.store.engine import make_engine

    store_url = f"sqlite:///{tmp_path}/coordination.db"
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", store_url)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    output = tmp_path / "output"
    dag = write_dag(
        DAG_SOURCE,
        DAG_ID=f"branching_{uuid.uuid4().hex[:8]}",
        INPUT=str(tmp_path / "input"),
        OUTPUT=str(output),
        DAYS=DAYS,
    )
    assert dag.task_dict["enrich"].upstream_task_ids == {"ingest", "weather"}
    assert dag.task_dict["enrich"].downstream_task_ids == {"delay_windows", "carrier_daily"}
    key = f"branching-{uuid.uuid4().hex[:8]}"

    run = dag.test(run_conf={"pipeline_key": key})

    assert str(run.state).endswith("success"), run.state
    coord = Coordinator(make_engine(store_url), key)
    views = coord.stages()
    assert set(views) == set(STAGE_IDS)
    for sid, view in views.items():
        assert view.lifecycle.value == "CLOSED", (sid, view.lifecycle)
        assert view.closed_checkpoint_id is not None and view.finish_threshold is not None
        assert view.closed_checkpoint_id >= view.finish_threshold, sid
    assert sorted(views["weather"].progress.finished_splits) == sorted(ORIGINS)
    assert len(views["ingest"].progress.finished_splits) == DAYS
    # enrich writes one part per batch (2 of 2 days + 1 day): carrier_daily has two splits
    assert len(views["carrier_daily"].progress.finished_splits) == 2

    days = first_days(DAYS)
    windows = reference_pipeline(days).windows
    parquet = ParquetTableSink("delay_windows_parquet", f"{output}/delay_windows")
    sql = SqlTableSink("delay_windows_sql", f"sqlite:///{output}/delay_windows.db", "delay_windows")
    assert_windows_match(parquet.read_pandas(), windows)
    assert_windows_match(sql.read_pandas(), windows)
    carrier = ParquetTableSink("carrier_daily_parquet", f"{output}/carrier_daily").read_pandas()
    expected = reference_carrier_daily(days)
    assert len(expected) > 3 * DAYS  # more than one carrier a day: a real aggregate
    assert_carrier_daily_match(carrier, expected)
    states = [state for _txn, state in coord.transactions()]
    assert states and set(states) == {"COMMITTED"}
