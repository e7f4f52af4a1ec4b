"""Stage operator wiring that needs no Spark job: master resolution, graph, templating."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator, default_pipeline_key


def _op(**kwargs: Any) -> FinalCheckpointStageOperator:
    from airflow.sdk import DAG

    with DAG(f"op_{id(kwargs)}", schedule=None, start_date=datetime(2026, 1, 1)):
        return FinalCheckpointStageOperator(task_id="s", transform=lambda c: None, **kwargs)


def test_master_from_spark_default_connection(airflow_home: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    assert _op()._spark_target().master == "local[*]"
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", "spark://127.0.0.1:7077")
    assert _op()._spark_target().master == "spark://127.0.0.1:7077"


def test_default_pipeline_key_is_path_safe_and_readable() -> None:
    from airflow_finalckpt.storage import validate_pipeline_key

    key = default_pipeline_key("dag", "manual__2026-11-22T03:45:16.123456+00:00")
    assert key.startswith("dag.manual__2026-11-22T03-45-16.123456-00-00.")
    assert validate_pipeline_key(key) == key
    for dag_id, run_id in [("-x", "r"), (".x", "r" * 400), ("d", "ünïcode run/..")]:
        key = default_pipeline_key(dag_id, run_id)
        assert validate_pipeline_key(key) == key and len(key) <= 200


def test_default_pipeline_keys_of_distinct_dag_runs_differ() -> None:
    """Replacing unsafe characters made these pairs one key (issue 27)."""
    colliding = [
        (
            ("etl", "scheduled__2026-01-01T00:00:00+00:00"),
            ("etl", "scheduled__2026-01-01T00-00-00-00-00"),
        ),
        (("a.b", "c"), ("a", "b.c")),
        (("d", "r" * 300 + "1"), ("d", "r" * 300 + "2")),
    ]
    for first, second in colliding:
        assert default_pipeline_key(*first) != default_pipeline_key(*second), (first, second)
    assert default_pipeline_key("a.b", "c") == default_pipeline_key("a.b", "c")  # stable


def test_bad_batch_size_is_refused() -> None:
    for bad in (0, "big", 2.5):
        with pytest.raises(ValueError, match="stage 's': batch_size must be an integer >= 1 or"):
            _op(batch_size=bad)
    with pytest.raises(ValueError, match="target_batch_s must be a number > 0"):
        _op(target_batch_s=0)
    assert _op().batch_size == "auto" and _op(batch_size=3).batch_size == 3


def test_split_keys_are_column_names() -> None:
    for bad in ("event_date", ["event_date", ""], [1]):
        with pytest.raises(ValueError, match="stage 's': split_keys must be a tuple of column"):
            _op(split_keys=bad)
    assert _op(split_keys=["event_date"]).split_keys == ("event_date",)
    assert _op().split_keys == ()


def test_graph_follows_dag_edges_and_stage_ids() -> None:
    from airflow.sdk import DAG

    with DAG("g", schedule=None, start_date=datetime(2026, 1, 1)):
        a = FinalCheckpointStageOperator(task_id="a", transform=lambda c: None)
        b = FinalCheckpointStageOperator(task_id="b", stage_id="b_v1", transform=lambda c: None)
        c = FinalCheckpointStageOperator(task_id="c", transform=lambda c: None)
        a >> [b, c]
        b >> c
    graph = c.pipeline_graph()
    assert graph.upstream("c") == ("a", "b_v1")
    assert graph.stages["b_v1"].airflow_task_id == "b"
    assert graph.fingerprint == a.pipeline_graph().fingerprint
