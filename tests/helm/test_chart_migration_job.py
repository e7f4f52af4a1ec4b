"""The rendered migration Job, run for real against PostgreSQL: its init container's script,
as the administrative user, creates the database and the least-privilege runtime user from
the ConfigMap's password-free URL plus the password env (the Secrets'), then its container's
command, `finalckpt db upgrade`, brings the schema to head, still as the administrative user.
Airflow components refused that store before and accept it after, connected as the runtime
user, who reads and writes the tables but can change no schema (issue 37).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_helpers import Rendered, container_env, pod_spec
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.pool import NullPool

from airflow_finalckpt.store import migrate
from airflow_finalckpt.store.deployment_secrets import CODE_SIGNING_KEY, ensure_secret
from airflow_finalckpt.store.engine import make_engine

pytestmark = pytest.mark.postgres

Render = Callable[..., Rendered]
PASSWORD = "from-the-secret"


@pytest.fixture
def new_database(pg_url: str) -> Iterator[tuple[Any, str]]:
    """(the server's URL, a database name that does not exist yet, also the name of the
    runtime user the Job creates); both dropped afterwards."""
    server = make_url(pg_url)
    name = f"{server.database}_job"
    yield server, name
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
    finally:
        admin.dispose()


def job_env(rendered: Rendered, container: dict[str, Any]) -> dict[str, str]:
    """The container's env as Kubernetes would set it: the ConfigMap, then the Secret refs
    (here every Secret key holds PASSWORD), nothing else of this process's finalckpt env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    for source in container.get("envFrom", []):
        assert source["configMapRef"]["name"] == "finalckpt-config"
        env.update(rendered.config())
    for name, value in container_env(container).items():
        env[name] = PASSWORD if isinstance(value, tuple) else value
    return env


def test_the_rendered_job_creates_and_upgrades_the_store(
    render: Render, new_database: tuple[Any, str], tmp_path: Path
) -> None:
    admin, database = new_database
    rendered = render(
        {
            "coordinationDb": {
                "airflowPostgres": {
                    "host": admin.host,
                    "port": admin.port or 5432,
                    "user": database,  # the runtime user: created by the Job
                    "admin": {"user": admin.username},
                    "database": database,
                    "sslmode": "disable",  # the local test server has no TLS
                }
            }
        }
    )
    spec = pod_spec(rendered.one("Job"))
    init, main = spec["initContainers"][0], spec["containers"][0]
    store_url = rendered.config()["AIRFLOW__FINALCKPT__STORE_URL"]
    assert make_url(store_url).password is None

    for container in (init, main):
        env = job_env(rendered, container)
        env["AIRFLOW_HOME"] = str(tmp_path / "airflow_home")
        assert env["AIRFLOW__FINALCKPT__STORE_PASSWORD"] == PASSWORD
        if container is main:  # as the administrative user
            assert make_url(env["AIRFLOW__FINALCKPT__STORE_URL"]).username == admin.username
        if container is init:
            argv = [sys.executable, *container["command"][1:], *container["args"]]
        else:
            assert container["command"] + container["args"] == ["finalckpt", "db", "upgrade"]
            argv = [str(Path(sys.executable).with_name("finalckpt")), "db", "upgrade"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert PASSWORD not in done.stdout + done.stderr
        if container is init:
            assert f"database {database} created" in done.stdout
            assert f"user {database} created" in done.stdout
        else:
            assert f"schema upgraded to revision {migrate.head_revision()}" in done.stdout

    engine = make_engine(store_url)  # as the runtime user (the test server trusts local logins)
    try:
        assert make_url(store_url).username == database
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert migrate.require_schema(engine) is False  # what every component now accepts
        first = ensure_secret(engine, CODE_SIGNING_KEY)  # reads and writes the tables
        assert ensure_secret(engine, CODE_SIGNING_KEY) == first
        for ddl in ("CREATE TABLE finalckpt_planted (id int)", "DROP TABLE finalckpt_stages"):
            refused = pytest.raises(ProgrammingError, match=r"permission denied|must be owner")
            with refused, engine.begin() as conn:
                conn.execute(text(ddl))
    finally:
        engine.dispose()
