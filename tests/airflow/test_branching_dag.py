"""The branching example DAG (two sources fanning in to enrich, two branches of different
length after it) through real Airflow ``dag.test()``, real Spark and real sinks, run serially,
with the lakehouse sinks on: every output (the delay windows in Parquet, SQL, Iceberg and Delta
Lake; carrier_daily in Parquet, Iceberg and Delta Lake) equals an independent pandas
computation, also as the example runner checks it, each table format holds exactly one commit,
and every stage closed on a checkpoint at or after its finish.
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
    lakehouse=True,
    # several batches per stage: carrier_daily's per-batch aggregate must still be exact
    batch_sizes={"ingest": 1, "weather": 2, "enrich": 2, "carrier_daily": 1},
)
"""


def test_branching_dag_publishes_every_output_exactly_once(
    write_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_finalckpt.coordination import Coordinator
    from airflow_finalckpt.examples.nycflights13.branching import branching_sinks
    from airflow_finalckpt.examples.nycflights13.run import read_sink, summarize
    from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink
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
    carrier = reference_carrier_daily(days)
    assert len(carrier) > 3 * DAYS  # more than one carrier a day: a real aggregate
    sinks = branching_sinks(str(output), lakehouse=True)
    kinds = {table: [type(s).__name__ for s in table_sinks] for table, table_sinks in sinks.items()}
    assert kinds == {
        "delay_windows": ["ParquetTableSink", "SqlTableSink", "IcebergTableSink", "DeltaTableSink"],
        "carrier_daily": ["ParquetTableSink", "IcebergTableSink", "DeltaTableSink"],
    }
    assert [s.sink_id for s in dag.task_dict["publish"].sinks] == [
        s.sink_id for s in sinks["delay_windows"]
    ]
    assert [s.sink_id for s in dag.task_dict["carrier_daily"].sinks] == [
        s.sink_id for s in sinks["carrier_daily"]
    ]
    for sink in sinks["delay_windows"]:
        assert_windows_match(read_sink(sink), windows)
    for sink in sinks["carrier_daily"]:
        assert_carrier_daily_match(read_sink(sink), carrier)
    # each table-format commit is one snapshot / version naming its transaction, never twice,
    # and it names a transaction the coordinator committed
    committed = {(txn.sink_id, txn.txn_id) for txn, state in coord.transactions()}
    for table_sinks in sinks.values():
        for sink in table_sinks:
            if isinstance(sink, IcebergTableSink):
                iceberg = sink.table()
                assert iceberg is not None, sink.sink_id
                ids = [str(s.summary["finalckpt.txn-id"]) for s in iceberg.snapshots()]
            elif isinstance(sink, DeltaTableSink):
                delta = sink.table()
                assert delta is not None, sink.sink_id
                ids = [str(c["finalckpt.txn-id"]) for c in delta.history()]
                assert len(ids) == delta.version() + 1, sink.sink_id
            else:
                continue
            assert ids and len(ids) == len(set(ids)), (sink.sink_id, ids)
            assert {(sink.sink_id, i) for i in ids} <= committed, sink.sink_id
            assert sink.staged_txn_ids() == set(), sink.sink_id
    states = [state for _txn, state in coord.transactions()]
    assert states and set(states) == {"COMMITTED"}

    # what the example runner prints and decides its exit code on: every sink equal to pandas
    monkeypatch.setenv("FINALCKPT_EXAMPLE_OUTPUT", str(output))
    report = summarize(key, DAYS, lakehouse=True)
    assert set(report["sinks"]) == {
        "delay_windows parquet",
        "delay_windows sql",
        "delay_windows iceberg",
        "delay_windows delta",
        "carrier_daily parquet",
        "carrier_daily iceberg",
        "carrier_daily delta",
    }
    for name, check in report["sinks"].items():
        assert check["verdict"] == "equal to the pandas reference", (name, check)
        assert check["rows"] == check["expected_rows"] > 0, (name, check)
