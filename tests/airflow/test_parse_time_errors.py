"""Mistakes in a stage's arguments are the DAG file's import error (issue 27): Airflow's own
DagBag parses a small DAG file, as the dag-processor does, and records one line naming the stage,
the argument and what is allowed; nothing runs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("airflow_home")

DAG_FILE = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink

TMP = {tmp!r}


def noop(ctx):
    return None


with DAG("parse_check", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    {body}
"""


def import_error(tmp_path: Path, body: str) -> str:
    """The DagBag import error of a DAG file whose DAG holds ``body``."""
    from airflow.dag_processing.dagbag import DagBag

    path = tmp_path / "parse_check.py"
    source = textwrap.dedent(DAG_FILE).format(tmp=str(tmp_path), body=body)
    path.write_text(source)
    bag = DagBag(dag_folder=str(path), bundle_path=tmp_path, bundle_name="parse-check")
    assert bag.dags == {}, "the DAG was imported although its stage is wrong"
    [(file, error)] = bag.import_errors.items()
    assert file.endswith("parse_check.py")
    return error


def op(args: str) -> str:
    return f'FinalCheckpointStageOperator(task_id="ingest", splits=["a"], {args})'


CASES = {
    "poll_interval": (
        op("transform=noop, poll_interval=0"),
        "stage 'ingest': argument poll_interval=0 is invalid: must be > 0 seconds",
    ),
    "checkpoint_interval": (
        op("transform=noop, checkpoint_interval=-1"),
        "stage 'ingest': argument checkpoint_interval=-1 is invalid: must be > 0 seconds, "
        "or None for the default",
    ),
    "spark_execution": (
        op("transform=noop, spark_execution='yarn'"),
        "stage 'ingest': argument spark_execution='yarn' is invalid: allowed values are "
        "'in-process', 'submit', 'connect' or None",
    ),
    "spark_deploy_mode": (
        op("transform=noop, spark_deploy_mode='remote'"),
        "stage 'ingest': argument spark_deploy_mode='remote' is invalid: allowed values are "
        "'client', 'cluster'",
    ),
    "transform": (
        op("transform=None"),
        "stage 'ingest': argument transform=None is invalid: must be a function",
    ),
    "stage_id": (
        op("transform=noop, stage_id='../x'"),
        "stage '../x': argument stage_id='../x' is invalid: it must be 1-250 ASCII letters",
    ),
    "commit_mode": (
        op("transform=noop, commit_mode='x'"),
        "stage 'ingest': argument commit_mode='x' is invalid: allowed values are "
        "'progressive', 'final'",
    ),
    "duplicate sink ids": (
        op(
            "transform=noop, sinks=[ParquetTableSink('out', TMP + '/t1'), "
            "ParquetTableSink('out', TMP + '/t2')]"
        ),
        "stage 'ingest': argument sinks=",
    ),
    "duplicate splits": (
        'FinalCheckpointStageOperator(task_id="ingest", transform=noop, splits=["a", "a"])',
        "stage 'ingest': argument splits=['a', 'a'] is invalid: must be a list of distinct",
    ),
    "batch_size": (
        op("transform=noop, batch_size=0"),
        "stage 'ingest': batch_size must be an integer >= 1",
    ),
    "allow_split_list_change": (
        op("transform=noop, allow_split_list_change='no'"),
        "stage 'ingest': argument allow_split_list_change='no' is invalid: must be True or False",
    ),
    "not a sink": (
        op("transform=noop, sinks=['out']"),
        "stage 'ingest': argument sinks=['out'] is invalid: every item must be a two-phase-commit",
    ),
    "parquet commit_mode": (
        op("transform=noop, sinks=[ParquetTableSink('out', TMP + '/t', commit_mode='x')]"),
        "sink 'out': argument commit_mode='x' is not one of 'auto', 'rename', 'copy'",
    ),
    "split_bytes type": (
        op("transform=noop, split_bytes=123"),
        "stage 'ingest': argument split_bytes=123 is invalid: must be a dict of split id -> bytes",
    ),
    "split_bytes value": (
        op("transform=noop, split_bytes={'a': -1}"),
        "stage 'ingest': argument split_bytes={'a': -1} is invalid: must be a dict of split id "
        "-> bytes (an int >= 0, or None for unknown), a callable of one split id returning that, "
        "or None; got ('a', -1)",
    ),
    "split_bytes downstream": (
        'FinalCheckpointStageOperator(task_id="enrich", transform=noop, split_bytes={"a": 1})',
        "stage 'enrich': argument split_bytes={'a': 1} is invalid: only a stage with its own "
        "splits= (a source) declares split sizes",
    ),
    "decorator": (
        "finalckpt_stage(noop, splits=['a'], poll_interval=-2)()",
        "stage 'noop': argument poll_interval=-2 is invalid: must be > 0 seconds",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_wrong_argument_is_the_dag_import_error(tmp_path: Path, case: str) -> None:
    body, expected = CASES[case]
    error = import_error(tmp_path, body)
    assert expected in error, error
    assert (
        "StageDefinitionError" in error
        or "InvalidStageArgumentError" in error
        or ("ConfigurationError" in error)
    ), error


def test_duplicate_sink_ids_name_the_duplicate(tmp_path: Path) -> None:
    body, _ = CASES["duplicate sink ids"]
    error = import_error(tmp_path, body)
    assert "sink ids must be distinct within a stage; duplicated: ['out']" in error


def test_a_correct_stage_parses(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    path = tmp_path / "parse_ok.py"
    body = op(
        "transform=noop, poll_interval=1, checkpoint_interval=30, commit_mode='final', "
        "split_bytes={'a': 10}"
    )
    path.write_text(textwrap.dedent(DAG_FILE).format(tmp=str(tmp_path), body=body))
    bag = DagBag(dag_folder=str(path), bundle_path=tmp_path, bundle_name="parse-check")
    assert bag.import_errors == {}
    assert list(bag.dags) == ["parse_check"]


def test_a_missing_sqlite_directory_parses_and_fails_at_first_use_naming_the_sink(
    tmp_path: Path,
) -> None:
    """The DAG processor may run where a SQLite sink's directory does not exist (or before a task
    creates it): the DAG parses, and the sink's first connection fails naming the sink."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_finalckpt.core.errors import ConfigurationError
    from airflow_finalckpt.sinks import SqlTableSink

    url = f"sqlite:///{tmp_path}/nowhere/x.db"
    path = tmp_path / "parse_ok.py"
    body = op(f"transform=noop, sinks=[SqlTableSink('rows', {url!r}, 'rows')]")
    path.write_text(textwrap.dedent(DAG_FILE).format(tmp=str(tmp_path), body=body))
    bag = DagBag(dag_folder=str(path), bundle_path=tmp_path, bundle_name="parse-check")
    assert bag.import_errors == {}
    sink = SqlTableSink("rows", url, "rows")
    with pytest.raises(ConfigurationError, match="sink 'rows': argument url: the SQLite file's"):
        sink.committed_txn_ids()
    (tmp_path / "nowhere").mkdir()
    assert sink.committed_txn_ids() == set()


# ------------------------------------------------------------ the whole DAG (issue 37)

GRAPH_CASES = {
    "one stage_id on two tasks": (
        'FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["x"], stage_id="s")\n'
        '    FinalCheckpointStageOperator(task_id="b", transform=noop, splits=["y"], stage_id="s")',
        "InvalidGraphError: stage id 's' is given to two tasks ('a' and 'b'); stage ids must be "
        "unique in a pipeline",
    ),
    "unknown primary_input": (
        'a = FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["x"])\n'
        '    b = FinalCheckpointStageOperator(task_id="b", transform=noop, primary_input="nope")\n'
        "    a >> b",
        "StageDefinitionError: stage 'b': primary_input 'nope' is not an upstream stage (its "
        "upstream stages: ['a'])",
    ),
    "primary_input of a stage that is not upstream": (
        'a = FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["x"])\n'
        '    b = FinalCheckpointStageOperator(task_id="b", transform=noop, splits=["y"])\n'
        '    c = FinalCheckpointStageOperator(task_id="c", transform=noop, primary_input="b")\n'
        "    a >> c",
        "stage 'c': primary_input 'b' is not an upstream stage (its upstream stages: ['a'])",
    ),
    "no input": (
        'FinalCheckpointStageOperator(task_id="a", transform=noop)',
        "stage 'a' needs `splits` (a source stage) or `primary_input` (it has 0 upstream stages)",
    ),
    "one sink_id in two stages": (
        'a = FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["x"], '
        'sinks=[ParquetTableSink("out", TMP + "/t1")])\n'
        '    b = FinalCheckpointStageOperator(task_id="b", transform=noop, '
        'sinks=[ParquetTableSink("out", TMP + "/t2")])\n'
        "    a >> b",
        "StageDefinitionError: sink id 'out' is used by stages 'a' and 'b'; sink ids must be "
        "unique in a pipeline",
    ),
    "two sinks on one path in one stage": (
        'FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["x"], '
        'sinks=[ParquetTableSink("one", TMP + "/t"), ParquetTableSink("two", TMP + "/t/")])',
        "StageDefinitionError: sinks 'one' (stage 'a') and 'two' (stage 'a') both write "
        "file://{tmp}/t; give a table one sink in a pipeline",
    ),
    "two sinks on one table in two stages": (
        'a = FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["x"], '
        'sinks=[SqlTableSink("one", conn_id="warehouse", table="rows")])\n'
        '    b = FinalCheckpointStageOperator(task_id="b", transform=noop, '
        'sinks=[SqlTableSink("two", conn_id="warehouse", table="rows")])\n'
        "    a >> b",
        "sinks 'one' (stage 'a') and 'two' (stage 'b') both write sql://warehouse/rows",
    ),
}


@pytest.mark.parametrize("case", sorted(GRAPH_CASES))
def test_a_graph_level_mistake_is_the_dag_import_error(tmp_path: Path, case: str) -> None:
    body, expected = GRAPH_CASES[case]
    error = import_error(tmp_path, body)
    assert expected.format(tmp=tmp_path) in error, error
    assert "\n" not in error.strip(), error


def test_distinct_sinks_and_inputs_parse(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    body = (
        'a = FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["x"], '
        'sinks=[ParquetTableSink("one", TMP + "/t1"), ParquetTableSink("two", TMP + "/t2")])\n'
        '    b = FinalCheckpointStageOperator(task_id="b", transform=noop, splits=["y"])\n'
        '    c = FinalCheckpointStageOperator(task_id="c", transform=noop, primary_input="b", '
        'sinks=[SqlTableSink("three", conn_id="warehouse", table="rows")])\n'
        '    d = FinalCheckpointStageOperator(task_id="d", transform=noop)\n'
        "    [a, b] >> c\n"
        "    a >> d"
    )
    path = tmp_path / "parse_ok.py"
    path.write_text(textwrap.dedent(DAG_FILE).format(tmp=str(tmp_path), body=body))
    bag = DagBag(dag_folder=str(path), bundle_path=tmp_path, bundle_name="parse-check")
    assert bag.import_errors == {}
    assert list(bag.dags) == ["parse_check"]
