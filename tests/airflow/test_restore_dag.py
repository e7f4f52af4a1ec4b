"""A savepoint restored into a NEW DAG run on "another cluster": an empty coordination database
and its own checkpoint storage (holding a copy of the pipeline's directory), with only the
savepoint path in the DAG run conf.

The savepoint is taken mid-``enrich`` by a stop with savepoint on the stage runtime (no Airflow);
the example DAG then runs through real ``dag.test()`` with ``restore_from``: ``ingest`` starts
no Spark work, ``enrich`` processes only the splits the savepoint had not finished, and both
sinks equal the independent pandas computation. A drained savepoint is refused.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.model import StopMode, StopState
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.examples.nycflights13.reference import (
    assert_windows_match,
    reference_pipeline,
)
from airflow_finalckpt.runtime.runner import RunStatus
from airflow_finalckpt.sinks import ParquetTableSink, SqlTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

DAYS = 14
DAG_ID = "nycflights13_restore_test"

pytestmark = pytest.mark.slow


@pytest.fixture
def other_cluster(airflow_home: Any, tmp_path: Path) -> Iterator[Path]:
    """The settings of a cluster that never saw the pipeline."""
    env = {
        "AIRFLOW__FINALCKPT__STORE_URL": f"sqlite:///{tmp_path}/other-coordination.db",
        "AIRFLOW__FINALCKPT__STORAGE_URI": str(tmp_path / "other-checkpoints"),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield tmp_path
    finally:
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
            XComModel.get_many(run_id=run_id, key=key, task_ids=task_id, dag_ids=DAG_ID)
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def _dag_file(airflow_home: Any, input_dir: str, output_dir: str) -> Any:
    """dag.test() finds its DAG through the DAG bundle: write a DAG file into the dags folder."""
    target = airflow_home.dags_folder / f"{DAG_ID}.py"
    target.write_text(
        "from airflow_finalckpt.examples.nycflights13.dag import build_dag\n"
        f"dag = build_dag({DAG_ID!r}, input_dir={input_dir!r}, output_dir={output_dir!r}, "
        f"days={DAYS}, retries=0)\n"
    )
    spec = importlib.util.spec_from_file_location(f"{DAG_ID}_module", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def _savepoint_mid_enrich(spark: Any, input_dir: str, work: Path) -> tuple[str, frozenset[str]]:
    """Run the pipeline on the source cluster and stop it with a savepoint after enrich's
    first durable batch; returns the savepoint path and enrich's finished splits."""
    storage = CheckpointStorage(str(work / "source-checkpoints"))
    engine = make_engine(f"sqlite:///{work}/source-coordination.db")
    ensure_schema(engine)
    coord = Coordinator(engine, "nyc-source-run", writer=storage)

    def operator_presses_stop(stage_id: str, point: str) -> None:
        if stage_id == "enrich" and point == "after-record-batch" and not coord.stop_request():
            coord.request_stop(StopMode.SAVEPOINT, "test")

    run = run_example_locally(
        spark,
        input_dir,
        coord,
        storage,
        sinks=[],
        batch_sizes={"ingest": 7, "enrich": 1},
        fault=operator_presses_stop,
    )
    assert run.results["enrich"].status is RunStatus.SUSPENDED
    stop = coord.stop_request()
    assert stop is not None and stop.state is StopState.COMPLETED
    path = coord.checkpoint(stop.savepoint_id or 0).metadata_path
    assert path is not None
    done = coord.stage("enrich").progress.finished_splits
    engine.dispose()
    return path, done


def test_a_savepoint_restores_into_a_new_dag_run_with_an_empty_store(
    spark: Any, other_cluster: Path, airflow_home: Any
) -> None:
    other_cluster_home = airflow_home
    work = other_cluster
    input_dir = str(work / "input")
    prepare_inputs(input_dir, days=first_days(DAYS))
    source_savepoint, done = _savepoint_mid_enrich(spark, input_dir, work)
    assert len(done) == 1
    # the savepoint travels with its pipeline directory (state and staged outputs), e.g. as a
    # backup copied into the other cluster's checkpoint storage
    source_root = work / "source-checkpoints"
    shutil.copytree(source_root / "nyc-source-run", work / "other-checkpoints" / "nyc-source-run")
    savepoint = str(work / "other-checkpoints" / Path(source_savepoint).relative_to(source_root))

    dag = _dag_file(other_cluster_home, input_dir, str(work / "output"))
    result = dag.test(run_conf={"restore_from": savepoint})
    assert str(result.state).endswith("success")

    ingest = _xcom(result.run_id, "ingest", "stage_run")
    # FULLY_FINISHED in the savepoint: restored finished, it only waits for a checkpoint
    assert ingest["status"] in ("finished", "closed") and ingest["spark_started"] is False
    assert ingest["processed_splits"] == []
    manifest = set(_xcom(result.run_id, "ingest", "end_of_data")["manifest"])
    enrich = _xcom(result.run_id, "enrich", "stage_run")
    assert set(enrich["processed_splits"]) == manifest - done
    expected = reference_pipeline(first_days(DAYS)).windows
    parquet = ParquetTableSink("delay_windows_parquet", f"{work}/output/delay_windows")
    sql = SqlTableSink(
        "delay_windows_sql", f"sqlite:///{work}/output/delay_windows.db", "delay_windows"
    )
    assert_windows_match(parquet.read_pandas(), expected)
    assert_windows_match(sql.read_pandas(), expected)
    coord = Coordinator(make_engine(os.environ["AIRFLOW__FINALCKPT__STORE_URL"]), "nyc-source-run")
    assert coord.restored_from() == savepoint
    assert all(v.lifecycle.value == "CLOSED" for v in coord.stages().values())


def test_only_the_savepoint_directory_copied_to_another_cluster_restores(
    spark: Any, other_cluster: Path, airflow_home: Any
) -> None:
    """A savepoint path alone is enough to restore. Only ``chk-<id>/`` is copied
    to the other cluster's storage root and the source storage is deleted; the restore maps the
    savepoint's own copies of its state, outputs and manifests into the new pipeline directory
    and both sinks equal the pandas reference."""
    work = other_cluster
    input_dir = str(work / "input")
    prepare_inputs(input_dir, days=first_days(DAYS))
    source_savepoint, done = _savepoint_mid_enrich(spark, input_dir, work)
    source_root = work / "source-checkpoints"
    chk = Path(source_savepoint).parent
    target = work / "other-checkpoints" / chk.relative_to(source_root)
    shutil.copytree(chk, target)
    shutil.rmtree(source_root)  # nothing may be read from the source cluster
    assert sorted(p.name for p in target.parent.iterdir()) == [chk.name]
    savepoint = str(target)

    dag = _dag_file(airflow_home, input_dir, str(work / "output"))
    result = dag.test(run_conf={"restore_from": savepoint})
    assert str(result.state).endswith("success")

    manifest = set(_xcom(result.run_id, "ingest", "end_of_data")["manifest"])
    enrich = _xcom(result.run_id, "enrich", "stage_run")
    assert set(enrich["processed_splits"]) == manifest - done  # resumed, not started over
    expected = reference_pipeline(first_days(DAYS)).windows
    parquet = ParquetTableSink("delay_windows_parquet", f"{work}/output/delay_windows")
    sql = SqlTableSink(
        "delay_windows_sql", f"sqlite:///{work}/output/delay_windows.db", "delay_windows"
    )
    assert_windows_match(parquet.read_pandas(), expected)
    assert_windows_match(sql.read_pandas(), expected)
    coord = Coordinator(make_engine(os.environ["AIRFLOW__FINALCKPT__STORE_URL"]), "nyc-source-run")
    assert coord.restored_from() == savepoint
    assert all(v.lifecycle.value == "CLOSED" for v in coord.stages().values())


def test_finalckpt_restore_creates_the_dag_run(
    spark: Any, other_cluster: Path, airflow_home: Any, api_server: Any
) -> None:
    """`finalckpt restore DAG --from PATH` vets the savepoint and the DAG's graph (from the
    api-server) and creates a DAG run with ``restore_from`` in its conf through Airflow's REST
    API (``POST /api/v2/dags/{dag_id}/dagRuns``), logged in as an Airflow user."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from click.testing import CliRunner

    from airflow_finalckpt.cli.main import main

    work = other_cluster
    input_dir = str(work / "input")
    prepare_inputs(input_dir, days=first_days(DAYS))
    savepoint, _ = _savepoint_mid_enrich(spark, input_dir, work)
    dag = _dag_file(airflow_home, input_dir, str(work / "output"))
    dag.test(mark_success_pattern=".*")  # puts the DAG into the metadata database, runs nothing
    store = f"sqlite:///{work}/source-coordination.db"
    env = {
        "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "source-checkpoints"),
        "AIRFLOW__FINALCKPT__API_URL": api_server.url,
        "AIRFLOW__FINALCKPT__API_USERNAME": "ann",
        "AIRFLOW__FINALCKPT__API_PASSWORD": api_server.users["ann"][1],
    }

    args = ["restore", DAG_ID, "--from", savepoint, "--run-id", "restored-1"]
    result = CliRunner(env=env).invoke(main, [*args, "--store-url", store])
    assert result.exit_code == 0, result.stderr
    assert f"can be restored into {DAG_ID}" in result.stdout
    assert "created DAG run restored-1" in result.stdout
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=DAG_ID, run_id="restored-1").one()
        assert run.conf == {"restore_from": savepoint}

    foreign = CliRunner(env=env).invoke(
        main, ["restore", "no_such_dag", "--from", savepoint, "--store-url", store]
    )
    assert foreign.exit_code == 2
    assert "DAG 'no_such_dag' is not known to Airflow" in foreign.stderr
    assert "belongs to" not in foreign.stderr  # no DAG run is linked to the local pipeline
