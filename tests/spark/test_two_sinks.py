"""Two sinks of one stage on real Spark (issue 37): on one table path they once shared one
``txn-<id>/`` and one input row became two committed rows; now the stage is refused before it
stages anything, and sinks on distinct paths each own their transactions (the sink id is part
of the transaction id and of the staging path) and commit every row once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import StageDefinitionError
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

DAYS = first_days(3)
BATCHES = {"ingest": 2, "enrich": 1, "delay_windows": 1, "publish": 1}


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    prepare_inputs(tmp_path / "inputs", days=DAYS)
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    return {
        "inputs": str(tmp_path / "inputs"),
        "coord": Coordinator(engine, "two-sinks", writer=storage),
        "storage": storage,
        "out": tmp_path / "out",
    }


def test_two_sinks_on_one_path_are_refused_and_commit_nothing(
    spark: SparkSession, setup: dict[str, Any]
) -> None:
    table = str(setup["out"] / "windows")
    sinks = [ParquetTableSink("windows_a", table), ParquetTableSink("windows_b", table + "/")]
    with pytest.raises(StageDefinitionError) as refused:
        run_example_locally(
            spark, setup["inputs"], setup["coord"], setup["storage"], sinks, batch_sizes=BATCHES
        )
    message = str(refused.value)
    assert "\n" not in message
    assert (
        f"sinks 'windows_a' (stage 'publish') and 'windows_b' (stage 'publish') both write "
        f"file://{table}" in message
    )
    coord: Coordinator = setup["coord"]
    assert [t for t, state in coord.transactions() if state == "COMMITTED"] == []
    assert sinks[0].committed_txn_ids() == set() and sinks[0].staged_txn_ids() == set()
    assert not Path(table).exists() or sinks[0].read_pandas().empty


def test_each_sink_owns_its_transactions_and_commits_each_row_once(
    spark: SparkSession, setup: dict[str, Any]
) -> None:
    sinks = [
        ParquetTableSink("windows_a", str(setup["out"] / "a")),
        ParquetTableSink("windows_b", str(setup["out"] / "b")),
    ]
    run_example_locally(
        spark, setup["inputs"], setup["coord"], setup["storage"], sinks, batch_sizes=BATCHES
    )
    expected = reference_pipeline(DAYS)
    for sink in sinks:
        assert_windows_match(sink.read_pandas(), expected.windows)
    a, b = (sink.committed_txn_ids() for sink in sinks)
    assert a and b and not a & b
    assert all(".windows_a.e" in txn for txn in a), a
    assert all(".windows_b.e" in txn for txn in b), b
    coord: Coordinator = setup["coord"]
    recorded = {(t.sink_id, t.txn_id) for t, state in coord.transactions() if state == "COMMITTED"}
    assert recorded == {("windows_a", t) for t in a} | {("windows_b", t) for t in b}
