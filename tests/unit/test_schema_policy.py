"""Who may migrate the store (``migrate.require_schema``): a SQLite store creates and upgrades
itself, other stores only through ``finalckpt db upgrade`` unless ``[finalckpt] auto_migrate``
says otherwise; a refused store gets one line naming the command and both revisions.

The PostgreSQL side (real server, real Airflow components) is tests/airflow/test_schema_upgrade.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.spark.driver import open_driver_store
from airflow_finalckpt.store import migrate
from airflow_finalckpt.store.connect import open_store
from airflow_finalckpt.store.engine import make_engine

AUTO_MIGRATE_ENV = "AIRFLOW__FINALCKPT__AUTO_MIGRATE"


@pytest.fixture(autouse=True)
def _isolated(isolated_settings_env: Path) -> Path:
    return isolated_settings_env


def older_revision() -> str:
    """The revision before head (a store one release behind)."""
    head = migrate._script_directory().get_revision(migrate.head_revision())
    assert head is not None and isinstance(head.down_revision, str)
    return head.down_revision


def test_a_fresh_sqlite_store_still_creates_itself(sqlite_url: str) -> None:
    engine = open_store(sqlite_url, retries=0)
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()


def test_sqlite_with_auto_migrate_false_is_refused_and_untouched(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(sqlite_url)
    try:
        migrate.upgrade(engine, older_revision())
        tables = set(inspect(engine).get_table_names())
        monkeypatch.setenv(AUTO_MIGRATE_ENV, "false")
        with pytest.raises(migrate.SchemaBehindError) as info:
            open_store(sqlite_url, retries=0)
        message = str(info.value)
        assert "\n" not in message
        assert f"is at schema revision {older_revision()}" in message
        assert f"requires revision {migrate.head_revision()}" in message
        assert "run `finalckpt db upgrade`" in message
        assert (info.value.current, info.value.required) == (
            older_revision(),
            migrate.head_revision(),
        )
        assert migrate.current_revision(engine) == older_revision()
        assert set(inspect(engine).get_table_names()) == tables
    finally:
        engine.dispose()


def test_auto_migrate_true_lets_a_process_upgrade(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(sqlite_url)
    try:
        migrate.upgrade(engine, older_revision())
        monkeypatch.setenv(AUTO_MIGRATE_ENV, "True")
        assert migrate.require_schema(engine) is True
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert migrate.require_schema(engine) is False  # at head: nothing to do
    finally:
        engine.dispose()


def test_an_invalid_auto_migrate_is_a_one_line_error(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AUTO_MIGRATE_ENV, "sometimes")
    engine = make_engine(sqlite_url)
    try:
        with pytest.raises(ConfigurationError) as info:
            migrate.require_schema(engine)
    finally:
        engine.dispose()
    message = str(info.value)
    assert message.startswith(
        f"invalid finalckpt setting auto_migrate from env {AUTO_MIGRATE_ENV}: 'sometimes'"
    )
    assert "use true or false" in message
    assert not Path(make_engine(sqlite_url).url.database or "").exists()  # nothing created


def test_the_default_depends_on_the_dialect() -> None:
    sqlite = make_engine("sqlite:////tmp/never-opened.db")
    postgres = make_engine("postgresql+psycopg://u@127.0.0.1:1/never")
    try:
        assert migrate.auto_migrate_default(sqlite) is True
        assert migrate.auto_migrate_default(postgres) is False
    finally:
        sqlite.dispose()
        postgres.dispose()


def test_a_driver_creates_its_sqlite_store(sqlite_url: str) -> None:
    """The driver's own path (spark/driver.py): SQLite is the machine's, it may create it."""
    engine = open_driver_store(sqlite_url)
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()
