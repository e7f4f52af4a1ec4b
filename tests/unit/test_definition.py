"""The pipeline definition rules of ``core.definition`` (issue 37) over plain values, and the
sinks' targets they compare: the DAG-file-level tests are in
tests/airflow/test_parse_time_errors.py."""

from __future__ import annotations

from pathlib import Path

from airflow_finalckpt.core.definition import (
    SinkDecl,
    StageDecl,
    definition_errors,
    sink_clashes,
)
from airflow_finalckpt.sinks import DeltaTableSink, ParquetTableSink, SqlTableSink


def test_a_well_formed_pipeline_has_no_errors() -> None:
    stages = [
        StageDecl("a", "a", own_splits=True, sinks=(SinkDecl("x", "file:///t/x"),)),
        StageDecl("b", "b", upstream=("a",), sinks=(SinkDecl("y", "file:///t/y"),)),
        StageDecl("c", "c", upstream=("a", "b"), primary_input="b", sinks=(SinkDecl("z"),)),
    ]
    assert definition_errors(stages) == []


def test_every_mistake_is_reported_once_in_one_line() -> None:
    stages = [
        StageDecl("t1", "a", own_splits=True, sinks=(SinkDecl("x", "file:///t"),)),
        StageDecl("t2", "a", own_splits=True),
        StageDecl("t3", "c", upstream=("a",), primary_input="b", sinks=(SinkDecl("x"),)),
        StageDecl("t4", "d", upstream=("a", "c"), sinks=(SinkDecl("w", "file:///t"),)),
    ]
    errors = definition_errors(stages)
    assert errors == [
        "stage id 'a' is given to two tasks ('t1' and 't2'); stage ids must be unique in a "
        "pipeline",
        "stage 'c': primary_input 'b' is not an upstream stage (its upstream stages: ['a'])",
        "stage 'd' needs `splits` (a source stage) or `primary_input` (it has 2 upstream stages)",
        "sink id 'x' is used by stages 'a' and 'c'; sink ids must be unique in a pipeline",
        "sinks 'x' (stage 'a') and 'w' (stage 'd') both write file:///t; give a table one sink "
        "in a pipeline (each sink commits every row it is given)",
    ]


def test_unknown_targets_never_clash() -> None:
    assert sink_clashes([("a", SinkDecl("x")), ("b", SinkDecl("y"))]) == []


def test_sinks_name_their_tables_as_one_comparable_target(tmp_path: Path) -> None:
    table = tmp_path / "t"
    parquet = ParquetTableSink("p", str(table) + "/")
    delta = DeltaTableSink("d", f"file://{table}")
    assert parquet.target() == delta.target() == f"file://{table}"
    sql = SqlTableSink("s", f"sqlite:///{tmp_path}/db.sqlite", "rows")
    assert sql.target() == f"sqlite:///{tmp_path}/db.sqlite/rows"
    by_connection = SqlTableSink("s", conn_id="warehouse", table="rows")
    assert by_connection.target() == "sql://warehouse/rows"
    secret = SqlTableSink("s", "postgresql+psycopg://u:hunter2@db:5432/w", "rows")
    assert "hunter2" not in str(secret.target())
