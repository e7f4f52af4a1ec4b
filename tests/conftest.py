"""Fixtures shared by the whole suite: coordination store URLs (SQLite and PostgreSQL).

PostgreSQL: ``FINALCKPT_TEST_PG_URL`` names an admin database (default
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``); every test using ``pg_url`` gets its
own freshly created database, dropped afterwards, so parallel runs never collide. When the server
is unreachable, those tests skip, unless ``FINALCKPT_REQUIRE_POSTGRES=1`` (CI): then they fail.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

DEFAULT_PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
PG_CONNECT_TIMEOUT_S = 5
#: JVM flags for every Spark driver the suite starts (this process's session, the dag.test and
#: fault-campaign subprocesses, the e2e Airflow task processes: spark-submit adds
#: SPARK_SUBMIT_OPTS to the driver JVM it launches). The suite's JVMs live seconds to minutes on
#: small data and 2 shared cores, where C2 compilation and parallel GC threads were about half
#: of their CPU (docs/testing.md, "Why the suite is shaped so"); C1 alone and one GC thread
#: compute the same results. ``spark.*`` system properties are SparkConf defaults: 4 shuffle
#: partitions instead of 200 for the tiny data of DAGs that set none (a session's or a DAG's
#: own setting wins). A value set by the caller wins.
TEST_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dspark.sql.shuffle.partitions=4"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTS)
#: Tiers that start no Spark JVM: a run of only these does not build the CDS archive.
NO_SPARK_TIERS = ("unit", "helm")


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a lane (``FINALCKPT_LANE_SITE_PACKAGES``, set by scripts/lane.sh), once every test
    module is imported: stop the run unless the package came from the lane's site-packages.

    Every Spark JVM of a run that has Spark tests maps its classes from one class-data-sharing
    archive (``tests/spark_cds.py``; built once per machine, then cached): before any session or
    driver subprocess starts, so all of them inherit it. A short driver's JVM used ~25 % less
    CPU with it (docs/testing.md)."""
    site_packages = os.environ.get("FINALCKPT_LANE_SITE_PACKAGES")
    if site_packages:
        from tests.installed_package import installed_package_error

        if error := installed_package_error(site_packages):
            pytest.exit(error, returncode=pytest.ExitCode.USAGE_ERROR)
    tests_dir = Path(__file__).resolve().parent
    for item in session.items:
        try:
            tier = item.path.resolve().relative_to(tests_dir).parts[0]
        except ValueError:
            continue
        if tier not in NO_SPARK_TIERS:
            from tests.spark_cds import with_spark_cds

            os.environ["SPARK_SUBMIT_OPTS"] = with_spark_cds(os.environ["SPARK_SUBMIT_OPTS"])
            return


def pg_admin_url() -> URL:
    """The admin database URL, pinned to the psycopg 3 driver."""
    url = make_url(os.environ.get("FINALCKPT_TEST_PG_URL") or DEFAULT_PG_ADMIN_URL)
    return url.set(drivername="postgresql+psycopg")


def postgres_required() -> bool:
    return os.environ.get("FINALCKPT_REQUIRE_POSTGRES") == "1"


def _admin_engine() -> Engine:
    return create_engine(
        pg_admin_url(),
        isolation_level="AUTOCOMMIT",  # CREATE/DROP DATABASE cannot run in a transaction
        poolclass=NullPool,
        connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S},
    )


@pytest.fixture(scope="session")
def pg_available() -> bool:
    """Whether the admin database answers; skips (or fails in CI) when it does not."""
    admin = pg_admin_url()
    where = f"{admin.host}:{admin.port or 5432}"
    try:
        engine = _admin_engine()
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        reason = f"PostgreSQL not reachable at {where}"
        if postgres_required():
            pytest.fail(f"{reason} but FINALCKPT_REQUIRE_POSTGRES=1: {exc}", pytrace=False)
        pytest.skip(reason)
    return True


def _new_database(template: str | None = None) -> str:
    """Create a database (a copy of ``template``, else empty); returns its name."""
    name = f"finalckpt_test_{os.getpid()}_{uuid.uuid4().hex[:12]}"
    engine = _admin_engine()
    copy = f' TEMPLATE "{template}"' if template else ""
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
    engine.dispose()
    return name


def _drop_database(name: str) -> None:
    engine = _admin_engine()
    with engine.connect() as conn:
        # FORCE (PostgreSQL 13+) ends connections a test may have leaked.
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def _url(name: str) -> str:
    return pg_admin_url().set(database=name).render_as_string(hide_password=False)


@pytest.fixture
def pg_url(pg_available: bool) -> Iterator[str]:
    """A freshly created, empty PostgreSQL database (URL string with password), dropped after."""
    name = _new_database()
    try:
        yield _url(name)
    finally:
        _drop_database(name)


@pytest.fixture(scope="session")
def _pg_store_template(pg_available: bool) -> Iterator[str]:
    """One database migrated to head per session: every migrated test database is a copy of
    it (a file copy instead of running every migration again, ~0.3 s per test)."""
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.migrate import ensure_schema

    name = _new_database()
    try:
        engine = make_engine(_url(name))
        try:
            ensure_schema(engine)
        finally:
            engine.dispose()  # CREATE DATABASE ... TEMPLATE needs it without connections
        yield name
    finally:
        _drop_database(name)


@pytest.fixture
def pg_store_url(_pg_store_template: str) -> Iterator[str]:
    """A PostgreSQL database with its schema at head, as `finalckpt db upgrade` leaves it:
    Airflow components and Spark drivers refuse a PostgreSQL store they would have to migrate.
    """
    name = _new_database(template=_pg_store_template)
    try:
        yield _url(name)
    finally:
        _drop_database(name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A file-based SQLite URL in the test's temporary directory (the file does not exist yet)."""
    return f"sqlite:///{tmp_path / 'coordination.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    """A migrated (schema at head) coordination store, once on SQLite and once on PostgreSQL."""
    from airflow_finalckpt.store.engine import make_engine
    from airflow_finalckpt.store.migrate import ensure_schema

    if request.param == "postgres":
        return str(request.getfixturevalue("pg_store_url"))
    url: str = request.getfixturevalue("sqlite_url")
    engine = make_engine(url)
    try:
        ensure_schema(engine)
    finally:
        engine.dispose()
    return url


@pytest.fixture
def isolated_settings_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Hide the machine's finalckpt configuration: env, connection and airflow.cfg.

    Yields the temporary AIRFLOW_HOME the defaults resolve under.
    """
    from airflow_finalckpt import config

    for name in list(os.environ):
        if name.startswith("AIRFLOW__FINALCKPT__") or name == config.CONNECTION_ENV:
            monkeypatch.delenv(name)
    home = tmp_path / "airflow_home"
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    monkeypatch.setattr(config, "_read_airflow_cfg", lambda _name: None)
    yield home


# py4j logs "Closing down clientserver connection" from an atexit hook, after pytest closed the
# captured streams; keep that INFO line out of the way.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One small local SparkSession for the whole session (a JVM start costs seconds)."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("finalckpt-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
