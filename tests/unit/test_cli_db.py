"""`finalckpt db ...`: exit codes, messages, and no tracebacks for user errors."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text

from airflow_finalckpt.cli.main import main
from airflow_finalckpt.store import migrate
from airflow_finalckpt.store.engine import make_engine


@pytest.fixture(autouse=True)
def _isolated(isolated_settings_env: Path) -> Path:
    return isolated_settings_env


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def unused_local_port() -> int:
    """A port nothing listens on (bound then released), so connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unreachable_pg_url() -> str:
    return f"postgresql://finalckpt:hunter2@127.0.0.1:{unused_local_port()}/coord"


def assert_one_line_error(result: Result, *fragments: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), result.exception


# --------------------------------------------------------------------------- structure


def test_main_is_a_group_with_db_commands_others_can_extend() -> None:
    assert isinstance(main, click.Group)
    db = main.commands["db"]
    assert isinstance(db, click.Group)
    assert set(db.commands) == {"upgrade", "check", "url"}


def test_version() -> None:
    result = run("--version")
    assert result.exit_code == 0
    assert "0.1.0" in result.output


# --------------------------------------------------------------------------- db url


def test_url_prints_masked_url_and_source() -> None:
    result = run("db", "url", "--store-url", "postgresql://u:hunter2@pg:5432/coord")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "postgresql+psycopg://u:***@pg:5432/coord",
        "source: override",
    ]
    assert "hunter2" not in result.output


def test_url_from_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_FINALCKPT_DEFAULT",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "pg",
                "login": "u",
                "password": "hunter2",
                "schema": "coord",
            }
        ),
    )

    result = run("db", "url")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "postgresql+psycopg://u:***@pg/coord",
        "source: connection finalckpt_default (env AIRFLOW_CONN_FINALCKPT_DEFAULT)",
    ]


def test_url_default_is_under_airflow_home(isolated_settings_env: Path) -> None:
    result = run("db", "url")

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"sqlite:///{isolated_settings_env}/finalckpt/coordination.db",
        "source: default",
    ]


def test_url_bad_value_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", "mysql://u:hunter2@h/db")

    result = run("db", "url")

    assert result.exit_code == 1
    assert_one_line_error(
        result, "store_url from env AIRFLOW__FINALCKPT__STORE_URL", "unsupported database"
    )
    assert "hunter2" not in result.output


# --------------------------------------------------------------------------- db check / upgrade


def test_check_fresh_sqlite_is_behind_and_creates_nothing(sqlite_url: str, tmp_path: Path) -> None:
    result = run("db", "check", "--store-url", sqlite_url)

    assert result.exit_code == 1
    assert "current revision: none (database file" in result.stdout
    assert f"head revision: {migrate.head_revision()}" in result.stdout
    assert_one_line_error(result, "run `finalckpt db upgrade`")
    # no database file; AIRFLOW_HOME (the autouse fixture's) is made by Airflow's first import
    # in the process when that happens here (this test run alone, or first among a few)
    assert [p.name for p in tmp_path.iterdir() if p.name != "airflow_home"] == []


def test_upgrade_then_check(store_url: str) -> None:
    """store_url is already migrated: upgrade is a no-op, check passes."""
    upgrade = run("db", "upgrade", "--store-url", store_url)
    assert upgrade.exit_code == 0, upgrade.output
    assert f"schema already at revision {migrate.head_revision()}" in upgrade.stdout

    check = run("db", "check", "--store-url", store_url)
    assert check.exit_code == 0, check.output
    assert f"current revision: {migrate.head_revision()}" in check.stdout
    assert "schema is up to date" in check.stdout


def test_upgrade_creates_schema_from_env_url(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", sqlite_url)

    result = run("db", "upgrade")

    assert result.exit_code == 0, result.output
    assert f"schema upgraded to revision {migrate.head_revision()}" in result.stdout
    engine = make_engine(sqlite_url)
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()


def test_check_unknown_revision_exits_2(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    try:
        migrate.ensure_schema(engine)
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999_new'"))
    finally:
        engine.dispose()

    check = run("db", "check", "--store-url", sqlite_url)
    upgrade = run("db", "upgrade", "--store-url", sqlite_url)

    assert check.exit_code == 2
    assert_one_line_error(
        check, "schema revision 9999_new, unknown to airflow-finalckpt 0.1.0; upgrade the package"
    )
    assert upgrade.exit_code == 1
    assert_one_line_error(upgrade, "schema revision 9999_new")


def test_unreachable_database_is_a_one_line_error() -> None:
    url = unreachable_pg_url()

    check = run("db", "check", "--store-url", url)
    upgrade = run("db", "upgrade", "--store-url", url)

    assert check.exit_code == 2
    assert_one_line_error(check, "cannot reach coordination database", "finalckpt:***@127.0.0.1")
    assert upgrade.exit_code == 1
    assert_one_line_error(upgrade, "cannot reach coordination database")
    assert "hunter2" not in check.output + upgrade.output


def test_check_with_bad_configuration_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", "sqlite:///relative.db")

    result = run("db", "check")

    assert result.exit_code == 2
    assert_one_line_error(result, "relative")


# --------------------------------------------------------------------------- real executable


def finalckpt_executable() -> str:
    found = shutil.which("finalckpt", path=os.path.dirname(sys.executable))
    if found is None:
        pytest.fail(
            "the finalckpt console script is missing next to the interpreter; "
            "run `.venv/bin/pip install -e . --no-deps`"
        )
    return found


@pytest.mark.slow
def test_installed_console_script(sqlite_url: str, tmp_path: Path) -> None:
    exe = finalckpt_executable()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("AIRFLOW__FINALCKPT__") and key != "AIRFLOW_CONN_FINALCKPT_DEFAULT"
    }
    env["AIRFLOW_HOME"] = str(tmp_path / "airflow_home")

    def finalckpt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )

    behind = finalckpt("db", "check", "--store-url", sqlite_url)
    assert behind.returncode == 1, behind.stderr
    assert "current revision: none" in behind.stdout
    assert (
        behind.stderr.strip() == "error: schema is behind this package; run `finalckpt db upgrade`"
    )

    upgraded = finalckpt("db", "upgrade", "--store-url", sqlite_url)
    assert upgraded.returncode == 0, upgraded.stderr

    ok = finalckpt("db", "check", "--store-url", sqlite_url)
    assert ok.returncode == 0, ok.stderr
    assert "schema is up to date" in ok.stdout

    unreachable = finalckpt("db", "check", "--store-url", unreachable_pg_url())
    assert unreachable.returncode == 2
    assert len(unreachable.stderr.strip().splitlines()) == 1, unreachable.stderr
    assert unreachable.stderr.startswith("error: cannot reach coordination database ")
    assert "Traceback" not in unreachable.stderr
    assert "hunter2" not in unreachable.stdout + unreachable.stderr


def test_json_output_of_upgrade_and_check(sqlite_url: str) -> None:
    """--json: one document on stdout, the same exit codes (check: 1 while behind)."""
    behind = run("db", "check", "--store-url", sqlite_url, "--json")
    assert behind.exit_code == 1
    doc = json.loads(behind.stdout)
    assert doc["current_revision"] is None and doc["up_to_date"] is False
    assert doc["head_revision"] == migrate.head_revision()
    assert_one_line_error(behind, "run `finalckpt db upgrade`")

    upgraded = run("db", "upgrade", "--store-url", sqlite_url, "--json")
    assert upgraded.exit_code == 0, upgraded.output
    assert json.loads(upgraded.stdout) == {
        "store": sqlite_url,
        "source": "override",
        "from_revision": None,
        "revision": migrate.head_revision(),
        "upgraded": True,
    }
    again = json.loads(run("db", "upgrade", "--store-url", sqlite_url, "--json").stdout)
    assert again["upgraded"] is False and again["from_revision"] == migrate.head_revision()

    check = run("db", "check", "--store-url", sqlite_url, "--json")
    assert check.exit_code == 0
    assert json.loads(check.stdout)["up_to_date"] is True
