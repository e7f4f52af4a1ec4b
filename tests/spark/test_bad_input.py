"""Bad input on the real runtime: a clear error, nothing committed, earlier checkpoints intact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import FinalCheckpointError, InvalidGraphError
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs, split_path
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.examples.nycflights13.transforms import InputSchemaError
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.spark.stage import TransformError
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

DAYS = first_days(3)


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    layout = prepare_inputs(tmp_path / "inputs", days=DAYS)
    engine = make_engine(f"sqlite:///{tmp_path}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp_path / "checkpoints"))
    return {
        "layout": layout,
        "inputs": str(tmp_path / "inputs"),
        "coord": Coordinator(engine, "bad", writer=storage),
        "storage": storage,
        "sink": ParquetTableSink("out", str(tmp_path / "out")),
    }


def _snapshot(coord: Coordinator) -> list[tuple[int, str, str | None]]:
    return [(c.checkpoint_id, c.state.value, c.metadata_path) for c in coord.checkpoints()]


def _nothing_committed(coord: Coordinator, sink: ParquetTableSink) -> None:
    assert sink.committed_txn_ids() == set()
    assert [t for t, state in coord.transactions() if state == "COMMITTED"] == []


def test_transform_that_raises(
    spark: SparkSession, setup: dict[str, Any], monkeypatch: Any
) -> None:
    from airflow_finalckpt.examples.nycflights13 import stages

    def broken(ctx: Any) -> Any:
        return ctx.read_parts().select("no_such_column")

    real = stages.example_stages

    def patched(input_dir: str) -> list[stages.ExampleStage]:
        out = real(input_dir)
        out[1] = stages.ExampleStage("enrich", broken, primary_input="ingest")
        return out

    monkeypatch.setattr("airflow_finalckpt.examples.nycflights13.local.example_stages", patched)
    coord: Coordinator = setup["coord"]
    with pytest.raises(TransformError, match="stage 'enrich': transform failed on batch"):
        run_example_locally(spark, setup["inputs"], coord, setup["storage"], [setup["sink"]])
    before = _snapshot(coord)
    assert before and all(state == "COMPLETED" for _, state, _ in before)
    # the failed stage recorded nothing; ingest's checkpoint is intact and readable
    assert coord.stage("enrich").progress.finished_splits == frozenset()
    for _, _, path in before:
        assert (
            setup["storage"].read_checkpoint(path).stages["ingest"].status.value == "FULLY_FINISHED"
        )
    _nothing_committed(coord, setup["sink"])


def test_input_with_wrong_schema(spark: SparkSession, setup: dict[str, Any]) -> None:
    # the first split: the first batch of the auto-sized ingest reads it (the whole input: its
    # day files fit one cold batch)
    bad = split_path(setup["layout"], setup["layout"].split_ids[0])
    pq.write_table(pa.table({"year": [2013], "month": ["January"]}), bad)
    coord: Coordinator = setup["coord"]
    with pytest.raises(InputSchemaError) as info:
        run_example_locally(spark, setup["inputs"], coord, setup["storage"], [setup["sink"]])
    assert str(bad) in str(info.value) or bad.name in str(info.value)
    assert coord.stage("ingest").progress.finished_splits == frozenset()
    assert _snapshot(coord) == []
    _nothing_committed(coord, setup["sink"])


def test_missing_input_file(spark: SparkSession, setup: dict[str, Any]) -> None:
    missing = split_path(setup["layout"], setup["layout"].split_ids[0])
    missing.unlink()
    coord: Coordinator = setup["coord"]
    with pytest.raises(FinalCheckpointError) as info:
        run_example_locally(spark, setup["inputs"], coord, setup["storage"], [setup["sink"]])
    assert missing.name in str(info.value)
    assert _snapshot(coord) == []
    _nothing_committed(coord, setup["sink"])


def test_duplicate_stage_id_and_cycle_in_dag() -> None:
    from datetime import datetime

    from airflow.sdk import DAG

    from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator

    with DAG("dup", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        a = FinalCheckpointStageOperator(task_id="a", stage_id="same", transform=lambda c: None)
        b = FinalCheckpointStageOperator(task_id="b", stage_id="same", transform=lambda c: None)
        a >> b
    with pytest.raises(InvalidGraphError, match="duplicate stage id 'same'"):
        b.pipeline_graph()
    assert dag.dag_id == "dup"
    with pytest.raises(InvalidGraphError, match="cycle between stages"):
        StageGraph.build([Stage("x", ("y",)), Stage("y", ("x",))])
