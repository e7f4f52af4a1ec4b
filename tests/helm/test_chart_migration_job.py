"""The rendered migration Job, run for real against PostgreSQL: its init container's script
creates the database from the ConfigMap's password-free URL plus the password env (the
Secret's), then its container's command, `finalckpt db upgrade`, brings the schema to head;
Airflow components refused that store before and accept it after.
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
from sqlalchemy.pool import NullPool

from airflow_finalckpt.store import migrate
from airflow_finalckpt.store.engine import make_engine

pytestmark = pytest.mark.postgres

Render = Callable[..., Rendered]
PASSWORD = "from-the-secret"


@pytest.fixture
def new_database(pg_url: str) -> Iterator[tuple[Any, str]]:
    """(the server's URL, a database name that does not exist yet); dropped afterwards."""
    server = make_url(pg_url)
    name = f"{server.database}_job"
    yield server, name
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
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
                    "user": admin.username,
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
        else:
            assert f"schema upgraded to revision {migrate.head_revision()}" in done.stdout

    engine = make_engine(store_url)
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert migrate.require_schema(engine) is False  # what every component now accepts
    finally:
        engine.dispose()
