"""Opening the coordination store at start: retries with back-off, a clear final error, nothing
created (issue 5, bad input: a coordination database unreachable at start)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect
from sqlalchemy.exc import OperationalError

from airflow_finalckpt import config
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.store import connect
from airflow_finalckpt.store.connect import (
    StoreUnreachableError,
    backoff_delays,
    open_store,
)
from airflow_finalckpt.store.migrate import VERSION_TABLE, current_revision, head_revision

#: Port 1 on the loopback interface: nothing listens there, connecting is refused at once.
UNREACHABLE = "postgresql+psycopg://finalckpt:hunter2@127.0.0.1:1/coord"
MASKED = "postgresql+psycopg://finalckpt:***@127.0.0.1:1/coord"


class Recorder:
    def __init__(self) -> None:
        self.retries: list[tuple[int, str, float]] = []
        self.sleeps: list[float] = []

    def on_retry(self, attempt: int, error: BaseException, delay: float) -> None:
        self.retries.append((attempt, type(error).__name__, delay))

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def test_an_unreachable_postgres_is_retried_with_backoff_then_fails_clearly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = Recorder()
    caplog.set_level(logging.WARNING, logger="airflow_finalckpt.store.connect")
    with pytest.raises(StoreUnreachableError) as info:
        open_store(UNREACHABLE, retries=3, backoff_s=0.5, on_retry=rec.on_retry, sleep=rec.sleep)
    error = info.value
    message = str(error)
    assert message.startswith(f"cannot reach the coordination store {MASKED}: 4 attempts failed")
    assert "store_connect_retries=3, store_connect_backoff_s=0.5" in message
    assert "Nothing was created" in message and "hunter2" not in message
    assert "last error: " in message and "127.0.0.1" in message.split("last error: ")[1]
    assert isinstance(error, ConfigurationError)  # the CLI and the hook report it in one line
    assert isinstance(error.__cause__, OperationalError)
    assert error.attempts == 4 and error.url == MASKED
    # three retries, waits doubling: counted through the callback, not by timing
    assert rec.retries == [
        (1, "OperationalError", 0.5),
        (2, "OperationalError", 1.0),
        (3, "OperationalError", 2.0),
    ]
    assert rec.sleeps == [0.5, 1.0, 2.0]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3
    assert all(MASKED in w and "hunter2" not in w for w in warnings)
    assert "attempt 1 of 4" in warnings[0] and "retrying in 0.5 s" in warnings[0]


def test_no_retries_means_one_attempt() -> None:
    rec = Recorder()
    with pytest.raises(StoreUnreachableError, match="1 attempt failed"):
        open_store(UNREACHABLE, retries=0, on_retry=rec.on_retry, sleep=rec.sleep)
    assert rec.retries == [] and rec.sleeps == []


def test_backoff_doubles_up_to_its_cap() -> None:
    assert backoff_delays(5, 1.0) == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert backoff_delays(7, 10.0) == [10.0, 20.0, 30.0, 30.0, 30.0, 30.0, 30.0]
    assert backoff_delays(0, 1.0) == []


def test_a_store_that_answers_after_failures_is_opened_and_migrated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    real = connect.require_schema
    failures = iter([True, True])

    def flaky(engine: Any) -> bool:
        if next(failures, False):
            raise OperationalError("SELECT 1", {}, Exception("the database is starting up"))
        return real(engine)

    monkeypatch.setattr(connect, "require_schema", flaky)
    rec = Recorder()
    engine = open_store(url, retries=5, backoff_s=2.0, on_retry=rec.on_retry, sleep=rec.sleep)
    try:
        assert [r[0] for r in rec.retries] == [1, 2] and rec.sleeps == [2.0, 4.0]
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_other_errors_are_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def newer_schema(_engine: Any) -> bool:
        raise ConfigurationError("coordination database is at schema revision zzz, unknown")

    monkeypatch.setattr(connect, "require_schema", newer_schema)
    rec = Recorder()
    with pytest.raises(ConfigurationError, match="unknown") as info:
        open_store(f"sqlite:///{tmp_path / 's.db'}", on_retry=rec.on_retry, sleep=rec.sleep)
    assert not isinstance(info.value, StoreUnreachableError)
    assert rec.retries == [] and rec.sleeps == []


@pytest.mark.postgres
def test_a_missing_postgres_database_is_retried_and_nothing_is_created(
    pg_url: str, pg_available: bool
) -> None:
    """The server answers but the database does not exist: an unreachable store too; after the
    attempts no database and no table exist (the failed attempts created nothing)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    missing = make_url(pg_url).set(database=f"{make_url(pg_url).database}_missing")
    url = missing.render_as_string(hide_password=False)
    rec = Recorder()
    with pytest.raises(StoreUnreachableError, match="3 attempts failed") as info:
        open_store(url, retries=2, backoff_s=0.1, on_retry=rec.on_retry, sleep=rec.sleep)
    assert "does not exist" in str(info.value)
    assert len(rec.retries) == 2
    admin = create_engine(make_url(pg_url), poolclass=NullPool)
    try:
        with admin.connect() as conn:
            found = conn.execute(
                text("SELECT count(*) FROM pg_database WHERE datname = :name"),
                {"name": missing.database},
            ).scalar_one()
        assert found == 0
        assert VERSION_TABLE not in inspect(admin).get_table_names()
    finally:
        admin.dispose()


def test_settings_have_sensible_defaults_and_are_validated(
    isolated_settings_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = config.load_settings()
    assert settings.store_connect_retries == 5 and settings.store_connect_backoff_s == 1.0
    assert "store_connect_retries = 5 (default)" in settings.describe()
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_CONNECT_RETRIES", "0")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_CONNECT_BACKOFF_S", "0.25")
    settings = config.load_settings()
    assert settings.store_connect_retries == 0 and settings.store_connect_backoff_s == 0.25
    for name, bad in (
        ("STORE_CONNECT_RETRIES", "-1"),
        ("STORE_CONNECT_RETRIES", "many"),
        ("STORE_CONNECT_BACKOFF_S", "0"),
    ):
        monkeypatch.setenv(f"AIRFLOW__FINALCKPT__{name}", bad)
        with pytest.raises(ConfigurationError, match=name.lower()):
            config.load_settings()
        monkeypatch.delenv(f"AIRFLOW__FINALCKPT__{name}")
