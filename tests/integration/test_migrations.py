"""Alembic migrations of the coordination store, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text

from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.store import migrate
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.schema import metadata

FOREIGN_TABLE = "airflow_foreign_table"
EXPECTED_TABLES = {table.name for table in metadata.sorted_tables}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest) -> str:
    """An empty coordination database (no schema), once per backend."""
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return url


@pytest.fixture
def engine(empty_url: str) -> Iterator[Engine]:
    engine = make_engine(empty_url)
    yield engine
    engine.dispose()


def create_foreign_table(engine: Engine) -> None:
    """A table the store does not own, with a row (think: one of Airflow's tables)."""
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {FOREIGN_TABLE} (id INTEGER PRIMARY KEY, name TEXT)"))
        conn.execute(text(f"INSERT INTO {FOREIGN_TABLE} (id, name) VALUES (1, 'keep me')"))


def foreign_rows(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT id, name FROM {FOREIGN_TABLE}"))]


def table_names(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def schema_diffs(engine: Engine) -> list[object]:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "version_table": migrate.VERSION_TABLE,
                "include_name": migrate.include_store_object,
                "compare_type": True,
                "compare_server_default": True,
            },
        )
        return list(compare_metadata(context, metadata))


def set_version(engine: Engine, revision: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = :r"), {"r": revision})


# --------------------------------------------------------------------------- upgrade / downgrade


def test_upgrade_from_empty_creates_exactly_the_schema(engine: Engine) -> None:
    create_foreign_table(engine)
    assert migrate.current_revision(engine) is None

    migrate.upgrade(engine)

    assert schema_diffs(engine) == []
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert table_names(engine) == EXPECTED_TABLES | {migrate.VERSION_TABLE, FOREIGN_TABLE}
    assert foreign_rows(engine) == [(1, "keep me")]


def test_schema_comparison_detects_drift(engine: Engine) -> None:
    """The comparison above can fail: a missing index is reported."""
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_finalckpt_checkpoints_state"))

    diffs = schema_diffs(engine)

    assert [d[0] for d in diffs if isinstance(d, tuple)] == ["add_index"]


def test_downgrade_to_base_removes_every_store_table_and_keeps_foreign_ones(
    engine: Engine,
) -> None:
    create_foreign_table(engine)
    migrate.upgrade(engine)

    migrate.downgrade(engine, "base")

    assert {t for t in table_names(engine) if t.startswith("finalckpt_")} == set()
    assert FOREIGN_TABLE in table_names(engine)
    assert foreign_rows(engine) == [(1, "keep me")]
    assert migrate.current_revision(engine) is None


def test_upgrade_after_downgrade_round_trips(engine: Engine) -> None:
    migrate.upgrade(engine)
    migrate.downgrade(engine, "base")

    migrate.upgrade(engine, "head")

    assert schema_diffs(engine) == []
    assert migrate.current_revision(engine) == migrate.head_revision()


def test_version_table_is_separate_from_airflows(engine: Engine) -> None:
    """Airflow's own alembic_version in the same database is neither read nor written."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('airflow_rev_42')"))

    assert migrate.current_revision(engine) is None
    migrate.ensure_schema(engine)

    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).all() == [
            ("airflow_rev_42",)
        ]
    assert migrate.VERSION_TABLE in table_names(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()


# --------------------------------------------------------------------------- ensure_schema


def test_ensure_schema_is_idempotent_and_keeps_data(engine: Engine) -> None:
    assert migrate.ensure_schema(engine) is True
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO finalckpt_pipelines (pipeline_key, graph, fingerprint, "
                "next_checkpoint_id, retain_checkpoints, checkpoint_timeout_s, created_at, "
                "updated_at) VALUES ('p', '{}', 'f', 1, 3, 600, 0, 0)"
            )
        )

    assert migrate.ensure_schema(engine) is False
    assert migrate.ensure_schema(engine) is False

    with engine.connect() as conn:
        assert conn.execute(text("SELECT pipeline_key FROM finalckpt_pipelines")).all() == [("p",)]
    assert schema_diffs(engine) == []


def test_unknown_revision_is_refused_with_a_clear_message(engine: Engine) -> None:
    migrate.ensure_schema(engine)
    set_version(engine, "9999_from_the_future")
    expected = (
        "coordination database is at schema revision 9999_from_the_future, unknown to "
        f"airflow-finalckpt {migrate.package_version()}; upgrade the package"
    )

    for action in (
        migrate.ensure_schema,
        migrate.current_revision,
        migrate.upgrade,
        lambda e: migrate.downgrade(e, "base"),
    ):
        with pytest.raises(ConfigurationError) as info:
            action(engine)
        assert str(info.value) == expected
    assert migrate.package_version() == "0.1.0"
    # Nothing was touched.
    assert table_names(engine) >= EXPECTED_TABLES
    with engine.connect() as conn:
        version = conn.execute(text(f"SELECT version_num FROM {migrate.VERSION_TABLE}")).all()
    assert version == [("9999_from_the_future",)]


def test_failed_migration_transaction_leaves_nothing_behind(engine: Engine) -> None:
    """DDL runs inside the migration transaction on both backends (SQLite included)."""
    with pytest.raises(RuntimeError), migrate.migration_transaction(engine) as conn:
        conn.execute(text("CREATE TABLE finalckpt_half_done (id INTEGER)"))
        raise RuntimeError("boom")

    assert "finalckpt_half_done" not in table_names(engine)


def test_ensure_schema_creates_the_sqlite_directory(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a' / 'b' / 'coordination.db'}")
    try:
        assert migrate.ensure_schema(engine) is True
    finally:
        engine.dispose()
    assert (tmp_path / "a" / "b" / "coordination.db").is_file()


def test_ensure_schema_with_a_plain_sqlite_engine(sqlite_url: str) -> None:
    """An engine not from make_engine still migrates inside one write transaction."""
    engine = create_engine(sqlite_url)
    try:
        assert migrate.ensure_schema(engine) is True
        assert migrate.ensure_schema(engine) is False
        assert schema_diffs(engine) == []
    finally:
        engine.dispose()


def test_head_is_a_single_linear_history() -> None:
    assert migrate.head_revision() == "0012"
    assert migrate.known_revisions() == {f"{n:04d}" for n in range(1, 13)}
    assert Path(migrate.alembic_config().get_main_option("script_location") or "") == (
        migrate.MIGRATIONS_DIR
    )


# --------------------------------------------------------------------------- concurrency

CONCURRENT_ENSURE = textwrap.dedent(
    """
    import os, sys, time
    from sqlalchemy import create_engine
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.migrate import ensure_schema

    url, workdir, me, factory = sys.argv[1:5]
    engine = make_engine(url) if factory == "make_engine" else create_engine(url)
    open(os.path.join(workdir, "ready-" + me), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(workdir, "go")):
        if time.monotonic() > deadline:
            sys.exit("never got the go signal")
        time.sleep(0.002)
    print("upgraded" if ensure_schema(engine) else "already")
    """
)


@pytest.mark.slow
def test_ensure_schema_from_concurrent_processes(empty_url: str, tmp_path: Path) -> None:
    run_concurrent_ensure_schema(empty_url, tmp_path, "make_engine")


@pytest.mark.slow
def test_ensure_schema_from_concurrent_processes_with_plain_sqlite_engines(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Without make_engine's BEGIN IMMEDIATE, migrate must take the write lock itself."""
    run_concurrent_ensure_schema(sqlite_url, tmp_path, "create_engine")


def run_concurrent_ensure_schema(url: str, tmp_path: Path, factory: str) -> None:
    """Start 4 processes, release them at once into ensure_schema, check exactly one upgraded."""
    workers = 4
    workdir = tmp_path / "sync"
    workdir.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_ENSURE, url, str(workdir), str(i), factory],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(workers)
    ]
    try:
        deadline = time.monotonic() + 120
        while len(list(workdir.glob("ready-*"))) < workers:
            assert time.monotonic() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs), "a worker died before the start"
            time.sleep(0.01)
        (workdir / "go").touch()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()

    for proc, (_out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    outcomes = sorted(out.strip() for out, _err in results)
    assert outcomes == ["already"] * (workers - 1) + ["upgraded"]
    engine = make_engine(url)
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert schema_diffs(engine) == []
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_pg_fixture_database_is_unique_and_empty(pg_url: str) -> None:
    engine = make_engine(pg_url)
    try:
        assert table_names(engine) == set()
        assert os.path.basename(pg_url).startswith("finalckpt_test_")
    finally:
        engine.dispose()
