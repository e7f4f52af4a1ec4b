"""A PostgreSQL store is migrated by `finalckpt db upgrade` only (issue 27, item 4).

Real PostgreSQL (a fresh database per test) and real Airflow: a stage task run with
``dag.test()`` on a store one revision behind fails with the one-line ``db upgrade`` message and
changes nothing; after the command the same DAG runs. The triggerer's, the api-server's, the
hook's and the Spark driver's ways into the store refuse it the same way and run no DDL.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, inspect

from airflow_finalckpt.cli.main import main
from airflow_finalckpt.hooks import FinalCkptHook
from airflow_finalckpt.hooks import finalckpt as hook_module
from airflow_finalckpt.spark.driver import open_driver_store
from airflow_finalckpt.store import migrate
from airflow_finalckpt.store.engine import make_engine

pytestmark = pytest.mark.postgres

ONE_STAGE_DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator


def noop(ctx):
    return None


with DAG(
    DAG_ID, schedule=None, start_date=datetime(2026, 1, 1), default_args={"retries": 0}
) as dag:
    FinalCheckpointStageOperator(task_id="ingest", transform=noop, splits=["a", "b"])
"""


def older_revision() -> str:
    head = migrate._script_directory().get_revision(migrate.head_revision())
    assert head is not None and isinstance(head.down_revision, str)
    return head.down_revision


def schema_of(engine: Engine) -> tuple[str | None, set[str], dict[str, set[str]]]:
    """Revision, tables and their columns: what any DDL would change."""
    inspector = inspect(engine)
    tables = set(inspector.get_table_names())
    columns = {t: {c["name"] for c in inspector.get_columns(t)} for t in tables}
    return migrate.current_revision(engine), tables, columns


@pytest.fixture
def older_store(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Engine]]:
    """A PostgreSQL store one revision behind this package, configured for every component."""
    engine = make_engine(pg_url)
    migrate.upgrade(engine, older_revision())
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", pg_url)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_CONNECT_RETRIES", "0")
    monkeypatch.delenv("AIRFLOW__FINALCKPT__AUTO_MIGRATE", raising=False)
    hook_module.dispose_engines()
    try:
        yield pg_url, engine
    finally:
        hook_module.dispose_engines()
        engine.dispose()


def task_state(dag_run: Any) -> str:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id
            )
        ).one()
        return str(ti.state)


def test_stage_tasks_fail_on_an_older_store_and_run_after_db_upgrade(
    older_store: tuple[str, Engine],
    write_dag: Callable[..., Any],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, engine = older_store
    before = schema_of(engine)
    dag = write_dag(ONE_STAGE_DAG, DAG_ID=f"schema_{uuid.uuid4().hex[:8]}")

    refused = dag.test()

    assert task_state(refused) == "failed"
    captured = capfd.readouterr()
    task_log = captured.out + captured.err + caplog.text
    expected = (
        f"is at schema revision {older_revision()}, airflow-finalckpt "
        f"{migrate.package_version()} requires revision {migrate.head_revision()}: run "
        "`finalckpt db upgrade`"
    )
    assert expected in task_log, task_log[-3000:]
    assert schema_of(engine) == before  # no DDL, no version change

    upgrade = CliRunner().invoke(main, ["db", "upgrade", "--store-url", url, "--json"])
    assert upgrade.exit_code == 0, upgrade.output
    assert f'"from_revision": "{older_revision()}"' in upgrade.stdout
    assert migrate.current_revision(engine) == migrate.head_revision()

    hook_module.dispose_engines()
    again = write_dag(ONE_STAGE_DAG, DAG_ID=f"schema_{uuid.uuid4().hex[:8]}").test()
    assert task_state(again) == "success"


def test_no_component_migrates_an_older_postgres_store(
    older_store: tuple[str, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The triggerer (shared_engine), the api-server (default_control), tasks and sensors (the
    hook) and Spark drivers refuse the store with the named error and leave it as it was; the
    driver even when [finalckpt] auto_migrate is true."""
    from airflow_finalckpt.plugins.api.control import default_control, reset_default_control

    url, engine = older_store
    before = schema_of(engine)
    openers: dict[str, Callable[[], Any]] = {
        "triggerer": lambda: hook_module.shared_engine(url, retries=0),
        "api-server": default_control,
        "task hook": lambda: FinalCkptHook().get_coordinator("p.k"),
        "spark driver": lambda: open_driver_store(url),
    }
    for component, open_it in openers.items():
        reset_default_control()
        with pytest.raises(migrate.SchemaBehindError, match="run `finalckpt db upgrade`"):
            open_it()
        assert schema_of(engine) == before, component
    monkeypatch.setenv("AIRFLOW__FINALCKPT__AUTO_MIGRATE", "true")
    with pytest.raises(migrate.SchemaBehindError):
        open_driver_store(url)
    assert schema_of(engine) == before
    reset_default_control()


def test_an_empty_postgres_database_is_not_created_by_a_component(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW__FINALCKPT__AUTO_MIGRATE", raising=False)
    hook_module.dispose_engines()
    with pytest.raises(migrate.SchemaBehindError, match=r"is empty \(no schema\)"):
        hook_module.shared_engine(pg_url, retries=0)
    engine = make_engine(pg_url)
    try:
        assert schema_of(engine) == (None, set(), {})
        # the explicit opt-in for a PostgreSQL store: [finalckpt] auto_migrate = true
        monkeypatch.setenv("AIRFLOW__FINALCKPT__AUTO_MIGRATE", "true")
        hook_module.shared_engine(pg_url, retries=0)
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        hook_module.dispose_engines()
        engine.dispose()
