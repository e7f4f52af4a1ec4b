"""``[finalckpt] retain_checkpoints`` and ``checkpoint_timeout_s`` reach the pipeline through
the stage operator (a real ``dag.test()``; the stage is already CLOSED, so no Spark starts)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import EndOfData, StageSnapshot
from airflow_finalckpt.hooks import finalckpt as hook_module
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

ONE_STAGE_DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator


def noop(ctx):
    return None


with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["a1"])
"""


@pytest.fixture
def closed_pipeline(
    airflow_home: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, str]]:
    url = f"sqlite:///{tmp_path / 'coordination.db'}"
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", url)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS", "1")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__CHECKPOINT_TIMEOUT_S", "42")
    hook_module.dispose_engines()
    engine = make_engine(url)
    ensure_schema(engine)
    key = f"settings.{uuid.uuid4().hex[:8]}"
    coord = Coordinator(engine, key, writer=CheckpointStorage(str(tmp_path / "checkpoints")))
    coord.register(StageGraph.build([Stage("a", ())]))
    epoch = coord.start_attempt("a", total_splits=1).epoch
    coord.finish(
        "a",
        epoch,
        StageSnapshot(finished_splits=frozenset({"a1"}), end_of_data=EndOfData(manifest=["p"])),
    )
    coord.close("a", epoch, coord.closable_checkpoint("a") or 0)
    yield engine, key
    engine.dispose()
    hook_module.dispose_engines()


def test_retention_and_timeout_settings_reach_the_pipeline(
    closed_pipeline: tuple[Any, str], write_dag: Callable[..., Any]
) -> None:
    engine, key = closed_pipeline

    def stored() -> tuple[int, float]:
        with engine.connect() as conn:
            row = conn.execute(
                select(t.pipelines.c.retain_checkpoints, t.pipelines.c.checkpoint_timeout_s).where(
                    t.pipelines.c.pipeline_key == key
                )
            ).one()
        return int(row[0]), float(row[1])

    assert stored() == (3, 600.0)  # registered without settings: the defaults
    dag = write_dag(ONE_STAGE_DAG, DAG_ID=f"settings_{uuid.uuid4().hex[:8]}")
    dag_run = dag.test(run_conf={"pipeline_key": key})
    assert str(dag_run.state).endswith("success")
    assert stored() == (1, 42.0)


def test_a_dag_run_linked_under_an_older_key_keeps_its_pipeline(
    closed_pipeline: tuple[Any, str],
) -> None:
    """Default keys changed (issue 27): a DAG run whose stages ran under the old key, retried
    after the upgrade, continues that pipeline (found by its DAG run link), not a new one."""
    from airflow.sdk import DAG

    from airflow_finalckpt.core.pipeline_keys import default_pipeline_key
    from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator

    engine, key = closed_pipeline
    dag_id = f"legacy_{uuid.uuid4().hex[:8]}"
    Coordinator(engine, key).link_dag_run(dag_id, "manual__2026-01-01T00:00:00+00:00")
    with DAG(dag_id, schedule=None):
        op = FinalCheckpointStageOperator(task_id="a", transform=print, splits=["a1"])

    linked = op._resolve_key({"run_id": "manual__2026-01-01T00:00:00+00:00"})  # type: ignore[typeddict-item]
    fresh = op._resolve_key({"run_id": "manual__2026-01-02T00:00:00+00:00"})  # type: ignore[typeddict-item]
    assert linked.pipeline_key == key
    assert fresh.pipeline_key == default_pipeline_key(dag_id, "manual__2026-01-02T00:00:00+00:00")
