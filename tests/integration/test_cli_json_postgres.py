"""Every ``--json`` command of the installed ``finalckpt`` script prints one JSON document on
stdout, nothing else, with PostgreSQL as the store: on a fresh database (``db upgrade`` runs the
migrations, whose Alembic lines used to land on stdout under Airflow's logging; other commands
refuse a store they would have to migrate) and on an existing one. Logs go to stderr.

Run as real subprocesses (the console script, Airflow's real logging setup), not CliRunner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import StopMode
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import current_revision, head_revision

pytestmark = pytest.mark.postgres

DAG = "flights"
RUN = "manual__json"
KEY = "flights.manual__json"
SCRIPT = str(Path(sys.executable).with_name("finalckpt"))


def finalckpt(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The console script on the store (``--direct-store`` where it applies: no api-server)."""
    direct = ["--direct-store"] if args[0] in ("stop", "resume", "reset", "status") else []
    return subprocess.run(
        [SCRIPT, *args, *direct], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def cli_env(pg_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(tmp_path / "airflow_home"),
        AIRFLOW__FINALCKPT__STORE_URL=pg_url,
        AIRFLOW__FINALCKPT__STORAGE_URI=str(tmp_path / "checkpoints"),
        # Airflow's logging at INFO on its console handler: what put Alembic on stdout
        AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
    )
    return env


def parse_only_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as exc:  # pragma: no cover - the failure this test is about
        pytest.fail(f"stdout is not one JSON document ({exc}):\n{result.stdout[:2000]}")


def _savepoint(tmp_path: Path) -> str:
    """A savepoint taken on another store (SQLite), in the CLI's checkpoint storage."""
    from airflow_finalckpt.store.migrate import ensure_schema

    engine = make_engine(f"sqlite:///{tmp_path / 'source.db'}")
    try:
        ensure_schema(engine)
        coord = Coordinator(engine, KEY, writer=CheckpointStorage(str(tmp_path / "checkpoints")))
        coord.register(StageGraph.from_edges(["ingest", "enrich"], [("ingest", "enrich")]))
        epoch = coord.start_attempt("ingest", total_splits=4).epoch
        coord.request_stop(StopMode.SAVEPOINT, "test")
        coord.record_batch("ingest", epoch, finished_splits=["d1"])
        coord.suspend("ingest", epoch)
        path = coord.checkpoint(1).metadata_path
        assert path is not None
        return path
    finally:
        engine.dispose()


def test_fresh_database_is_migrated_by_db_upgrade_and_stdout_is_only_json(
    cli_env: dict[str, str], pg_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    try:
        assert current_revision(engine) is None
        path = _savepoint(tmp_path)
        restore = ("restore", DAG, "--from", path, "--dry-run", "--no-graph-check", "--json")
        refused = finalckpt(cli_env, *restore)  # a PostgreSQL store is not migrated on the way
        assert refused.returncode == 2 and refused.stdout == ""
        assert "empty (no schema)" in refused.stderr
        assert "run `finalckpt db upgrade`" in refused.stderr
        assert current_revision(engine) is None
        upgraded = parse_only_json(finalckpt(cli_env, "db", "upgrade", "--json"))
        assert upgraded["from_revision"] is None and upgraded["upgraded"] is True
        assert upgraded["revision"] == head_revision()
        doc = parse_only_json(finalckpt(cli_env, *restore))
        assert doc["pipeline_key"] == KEY and doc["checkpoint_id"] == 1
        assert current_revision(engine) == head_revision()
        check = parse_only_json(finalckpt(cli_env, "db", "check", "--json"))
        assert check["up_to_date"] is True and check["current_revision"] == head_revision()
        result = finalckpt(cli_env, "status", DAG, RUN, "--json")
        assert result.returncode == 2
        assert result.stdout == ""  # Alembic's "Context impl PostgresqlImpl." was printed here
        assert result.stderr.strip().splitlines()[-1].startswith("error: no pipeline run is known")
    finally:
        engine.dispose()


def test_every_json_command_prints_only_json_on_an_existing_database(
    cli_env: dict[str, str], pg_url: str, tmp_path: Path
) -> None:
    from airflow_finalckpt.store.migrate import ensure_schema

    engine = make_engine(pg_url)
    try:
        ensure_schema(engine)
        coord = Coordinator(engine, KEY, writer=CheckpointStorage(str(tmp_path / "checkpoints")))
        coord.register(StageGraph.from_edges(["ingest", "enrich"], [("ingest", "enrich")]))
        coord.link_dag_run(DAG, RUN)
        epoch = coord.start_attempt("ingest", total_splits=4).epoch

        status = parse_only_json(finalckpt(cli_env, "status", DAG, RUN, "--json"))
        assert status["summary"]["pipeline_key"] == KEY

        stop = parse_only_json(finalckpt(cli_env, "stop", DAG, RUN, "--savepoint", "--json"))
        assert stop["mode"] == StopMode.SAVEPOINT.value and stop["state"] == "REQUESTED"
        coord.record_batch("ingest", epoch, finished_splits=["d1"])  # answers the savepoint
        coord.suspend("ingest", epoch)

        status = parse_only_json(finalckpt(cli_env, "status", DAG, RUN, "--json"))
        assert status["summary"]["state"] == "suspended"
        path = status["summary"]["stop"]["savepoint_path"]

        resumed = parse_only_json(finalckpt(cli_env, "resume", DAG, RUN, "--json"))
        assert resumed["state"] == "RESUMED"

        listed = parse_only_json(
            finalckpt(cli_env, "checkpoints", "list", "--pipeline", KEY, "--json")
        )
        assert [c["checkpoint_id"] for c in listed] == [1]
        shown = parse_only_json(finalckpt(cli_env, "checkpoints", "show", path, "--json"))
        assert shown["checkpoint_id"] == 1
        progress = parse_only_json(finalckpt(cli_env, "progress", "--pipeline", KEY, "--json"))
        assert progress["pipeline_key"] == KEY
    finally:
        engine.dispose()
