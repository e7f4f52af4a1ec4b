"""The graph-change check through Airflow's own entry points, with real serialized DAGs: the
stage operator in ``dag.test()`` (a ``pipeline_key`` continuation), ``finalckpt restore`` (over
HTTP to Airflow's api-server: the graph from the plugin's stages route, the new run from
``POST /api/v2/dags/{dag_id}/dagRuns``) and the REST restore (FastAPI test client, real
SimpleAuthManager token, real ``trigger_dag``). The rule matrix itself is
tests/integration/test_graph_change_matrix.py.

The pipeline ``a -> b`` has ``a`` CLOSED and ``b`` stopped at a savepoint with one of three
splits finished; the changed DAG renames ``b``'s stage id to ``b_v2`` (same task ``b``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, MetaData, select

from airflow_finalckpt.control import PipelineControl, dag_stage_graph
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import EndOfData, StageSnapshot, StopMode
from airflow_finalckpt.hooks import finalckpt as hook_module
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

if TYPE_CHECKING:
    from tests.airflow.conftest import ApiServer

OLD = StageGraph.build([Stage("a", ()), Stage("b", ("a",))])

#: task ``b`` now runs stage ``b_v2``: its progress would be lost
RENAMED_DAG = """
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator


def noop(ctx):
    return None


with DAG(
    DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    default_args={"retries": 2, "retry_delay": timedelta(0)},
) as dag:
    a = FinalCheckpointStageOperator(task_id="a", transform=noop, splits=["a1"])
    b = FinalCheckpointStageOperator(task_id="b", stage_id="b_v2", transform=noop)
    a >> b
"""


@dataclass
class Env:
    engine: Engine
    storage: CheckpointStorage
    root: Path
    key: str
    savepoint: str

    def snapshot(self) -> tuple[Any, ...]:
        meta = MetaData()
        meta.reflect(self.engine)
        with self.engine.connect() as conn:
            rows = {
                name: sorted(repr(tuple(r)) for r in conn.execute(select(table)))
                for name, table in sorted(meta.tables.items())
            }
        files = sorted(
            (str(p.relative_to(self.root)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.root.rglob("*")
            if p.is_file()
        )
        return rows, files


@pytest.fixture
def env(airflow_home: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    url = f"sqlite:///{tmp_path / 'coordination.db'}"
    root = tmp_path / "checkpoints"
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", url)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(root))
    hook_module.dispose_engines()
    engine = make_engine(url)
    ensure_schema(engine)
    storage = CheckpointStorage(str(root))
    key = f"flights.{uuid.uuid4().hex[:8]}"
    coord = Coordinator(engine, key, writer=storage)
    coord.register(OLD)
    a = coord.start_attempt("a", total_splits=1).epoch
    coord.finish(
        "a",
        a,
        StageSnapshot(finished_splits=frozenset({"a1"}), end_of_data=EndOfData(manifest=["p0"])),
    )
    coord.close("a", a, coord.closable_checkpoint("a") or 0)
    b = coord.start_attempt("b", total_splits=3).epoch
    coord.record_batch("b", b, finished_splits=["s1"])
    coord.request_stop(StopMode.SAVEPOINT, "test")
    coord.record_batch("b", b)
    coord.suspend("b", b)
    stop = coord.stop_request()
    assert stop is not None and stop.savepoint_id is not None
    path = coord.checkpoint(stop.savepoint_id).metadata_path
    assert path is not None
    yield Env(engine, storage, root, key, path)
    engine.dispose()
    hook_module.dispose_engines()


def serialize(dag: Any) -> None:
    """Put a DAG into Airflow's metadata database, as the DAG processor does."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    DagBundlesManager().sync_bundles_to_db()
    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder",
            None,
            [LazyDeserializedDAG.from_dag(dag)],
            {},
            None,
            set(),
            session=session,
        )


def renamed_dag(dag_id: str) -> Any:
    from airflow.sdk import DAG

    from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator

    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        a = FinalCheckpointStageOperator(task_id="a", transform=lambda c: None, splits=["a1"])
        b = FinalCheckpointStageOperator(task_id="b", stage_id="b_v2", transform=lambda c: None)
        a >> b
    serialize(dag)
    return dag


def test_serialized_dag_keeps_stage_ids(env: Env) -> None:
    from airflow_finalckpt.plugins.api.dags import load_dag_graph

    dag = renamed_dag(f"graph_{uuid.uuid4().hex[:8]}")
    graph = load_dag_graph(dag.dag_id)
    assert graph.to_dict() == dag_stage_graph(dag.tasks).to_dict()
    assert graph.stages["b_v2"].airflow_task_id == "b" and graph.upstream("b_v2") == ("a",)


def test_the_stages_route_answers_the_graph_to_readers_only(api_server: ApiServer) -> None:
    """``GET /finalckpt/api/dags/{dag_id}/stages`` on Airflow's api-server, over HTTP."""
    dag = renamed_dag(f"stages_{uuid.uuid4().hex[:8]}")
    url = f"{api_server.url}/finalckpt/api/dags/{dag.dag_id}/stages"
    viewer = {"Authorization": f"Bearer {api_server.token('vic', 'VIEWER')}"}

    doc = httpx.get(url, headers=viewer).json()
    expected = dag_stage_graph(dag.tasks)
    assert doc == {
        "dag_id": dag.dag_id,
        "fingerprint": expected.fingerprint,
        "stages": [
            # a fixed split list is answered (the dry run's split-list rules), else null
            {
                "stage_id": "a",
                "task_id": "a",
                "upstream": [],
                "splits": ["a1"],
                "allow_split_list_change": False,
            },
            {
                "stage_id": "b_v2",
                "task_id": "b",
                "upstream": ["a"],
                "splits": None,
                "allow_split_list_change": False,
            },
        ],
    }
    assert httpx.get(url).status_code == 401
    nobody = {"Authorization": f"Bearer {api_server.token('nobody', None)}"}
    refused = httpx.get(url, headers=nobody)
    assert refused.status_code == 403
    assert refused.json()["detail"] == f"user 'nobody' may not read the tasks of DAG {dag.dag_id!r}"
    missing = httpx.get(f"{api_server.url}/finalckpt/api/dags/no_such_dag/stages", headers=viewer)
    assert missing.status_code == 404 and "'no_such_dag' not found" in missing.json()["detail"]


def _tries(dag_run: Any) -> dict[str, tuple[str, int]]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id
            )
        ).all()
        return {ti.task_id: (str(ti.state), int(ti.try_number)) for ti in tis}


def test_continuation_into_a_renamed_stage_fails_once_and_writes_nothing(
    env: Env, write_dag: Callable[..., Any]
) -> None:
    dag = write_dag(RENAMED_DAG, DAG_ID=f"cont_{uuid.uuid4().hex[:8]}")
    before = env.snapshot()
    dag_run = dag.test(run_conf={"pipeline_key": env.key})
    assert str(dag_run.state).endswith("failed")
    assert _tries(dag_run)["a"] == ("failed", 1)  # permanent: retries=2 not used
    assert env.snapshot() == before

    # the opt-in drops b's progress on purpose; b_v2 starts fresh (marked success here: its
    # Spark run is not what this test is about), a stays CLOSED and is not run again
    dag_run = dag.test(
        run_conf={"pipeline_key": env.key, "allow_drop_stages": ["b"]},
        mark_success_pattern="b",
    )
    assert _tries(dag_run)["a"] == ("success", 1)
    views = Coordinator(env.engine, env.key).stages()
    assert set(views) == {"a", "b_v2"}
    assert views["a"].lifecycle.value == "CLOSED"
    assert views["b_v2"].lifecycle.value == "NOT_STARTED"


def cli(env: Env, api_server: ApiServer, **settings: str) -> CliRunner:
    """The CLI pointed at the api-server, with ``settings`` as ``[finalckpt]`` env options."""
    options = {"storage_uri": str(env.root), "api_url": api_server.url, **settings}
    return CliRunner(env={f"AIRFLOW__FINALCKPT__{k.upper()}": v for k, v in options.items()})


def test_cli_dry_run_refuses_then_prints_the_plan(env: Env, api_server: ApiServer) -> None:
    """The graph comes from the api-server (the CLI logs in with user name and password)."""
    from airflow_finalckpt.cli.main import main

    dag = renamed_dag(f"cli_{uuid.uuid4().hex[:8]}")
    runner = cli(env, api_server, api_username="vic", api_password="vic-secret")
    store = ["--store-url", str(env.engine.url)]
    before = env.snapshot()
    refused = runner.invoke(
        main, ["restore", dag.dag_id, "--from", env.savepoint, "--dry-run", *store]
    )
    assert refused.exit_code == 2, refused.output
    assert refused.stdout == ""
    assert refused.stderr.startswith("error: stage 'b' violates restore rule 'rekeyed-stage'")
    assert len(refused.stderr.strip().splitlines()) == 1

    args = ["restore", dag.dag_id, "--from", env.savepoint, "--dry-run", "--allow-drop-stage", "b"]
    planned = runner.invoke(main, [*args, "--json", *store])
    assert planned.exit_code == 0, planned.stderr
    doc = json.loads(planned.stdout)
    assert doc["graph_checked"] is True and doc["allow_drop_stages"] == ["b"]
    assert doc["run_id"] is None  # a dry run creates nothing
    assert doc["plan"]["skipped"] == ["a"] and doc["plan"]["fresh"] == ["b_v2"]
    assert doc["plan"]["dropped_stages"] == ["b"]

    text = runner.invoke(main, [*args, *store])
    assert text.exit_code == 0, text.stderr
    assert "a: skip: redo nothing" in text.stdout
    assert "b: progress DROPPED (allow_drop_stages)" in text.stdout
    assert env.snapshot() == before


def _runs(dag_id: str) -> list[tuple[str, str | None, Any, str]]:
    """The DAG's runs in Airflow's database: (run id, triggering user, conf, note)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return [
            (r.run_id, r.triggering_user_name, r.conf, r.note or "")
            for r in session.query(DagRun).filter_by(dag_id=dag_id)
        ]


def test_cli_restore_creates_the_run_through_the_rest_api(env: Env, api_server: ApiServer) -> None:
    from airflow_finalckpt.cli.main import main

    dag = renamed_dag(f"clirun_{uuid.uuid4().hex[:8]}")
    args = ["restore", dag.dag_id, "--from", env.savepoint, "--allow-drop-stage", "b"]
    store = ["--store-url", str(env.engine.url)]
    before = env.snapshot()

    # a viewer may read the graph, but Airflow refuses them a new DAG run
    viewer = cli(env, api_server, api_token=api_server.token("vic", "VIEWER"))
    refused = viewer.invoke(main, [*args, "--run-id", "restored-by-vic", *store])
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.startswith(
        f"error: Airflow refused to create a DAG run of {dag.dag_id!r}"
    )
    assert _runs(dag.dag_id) == []

    admin = cli(env, api_server, api_username="ann", api_password="ann-secret")
    made = admin.invoke(main, [*args, "--run-id", "restored-1", *store])
    assert made.exit_code == 0, made.stderr
    assert f"created DAG run restored-1 of {dag.dag_id}" in made.stdout
    # the installed console script in its own process (this process's stdout also carries the
    # in-process api-server's log lines): stdout is exactly one document, the check and the run
    script = Path(sys.executable).with_name("finalckpt")
    env_vars = {
        **os.environ,
        **admin.env,
        "AIRFLOW__FINALCKPT__API_USERNAME": "ann",
        "AIRFLOW__FINALCKPT__API_PASSWORD": "ann-secret",
    }
    proc = subprocess.run(
        [str(script), *args, "--run-id", "restored-2", "--json", *store],
        env={k: v for k, v in env_vars.items() if v is not None},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["run_id"] == "restored-2" and doc["plan"]["dropped_stages"] == ["b"]
    runs = {run[0]: run for run in _runs(dag.dag_id)}
    assert sorted(runs) == ["restored-1", "restored-2"]
    (run_id, user, conf, note) = runs["restored-1"]
    assert (run_id, user) == ("restored-1", "ann")
    assert conf == {"restore_from": env.savepoint, "allow_drop_stages": ["b"]}
    assert note.startswith(f"airflow-finalckpt: restore from {env.savepoint} (by cli")
    again = admin.invoke(main, [*args, "--run-id", "restored-1", *store])
    assert again.exit_code == 2 and "could not create a DAG run" in again.stderr
    assert "HTTP 409" in again.stderr and len(_runs(dag.dag_id)) == 2
    assert env.snapshot() == before  # the stage tasks do the restore, not the CLI


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no credentials", "error: not authenticated at the Airflow API server"),
        ("forged token", "error: not authenticated at the Airflow API server"),
        ("wrong password", "error: Airflow refused the login of user 'ann'"),
        ("no role", "error: Airflow refused to read the stages of DAG"),
        ("unknown DAG", "error: DAG 'no_such_dag' is not known to Airflow at http://127.0.0.1:"),
        ("unreachable", "error: cannot reach the Airflow API server at http://127.0.0.1:"),
        # Airflow's web UI answers its HTML page for a path no app serves (no plugin there)
        ("not the plugin", "error: http://127.0.0.1:"),
    ],
)
def test_cli_restore_refusals_are_one_line_and_change_nothing(
    env: Env, api_server: ApiServer, case: str, message: str
) -> None:
    from airflow_finalckpt.cli.main import main

    dag = renamed_dag(f"clierr_{uuid.uuid4().hex[:8]}")
    settings = {
        "no credentials": {},
        "forged token": {"api_token": api_server.token("ann", "ADMIN")[:-4] + "AAAA"},
        "wrong password": {"api_username": "ann", "api_password": "not-her-password"},
        "no role": {"api_token": api_server.token("nobody", None)},
        "unknown DAG": {"api_token": api_server.token("ann", "ADMIN")},
        "unreachable": {"api_url": "http://127.0.0.1:1"},
        "not the plugin": {
            "api_url": f"{api_server.url}/elsewhere",
            "api_token": api_server.token("ann", "ADMIN"),
        },
    }[case]
    dag_id = "no_such_dag" if case == "unknown DAG" else dag.dag_id
    before = env.snapshot()
    result = cli(env, api_server, **settings).invoke(
        main, ["restore", dag_id, "--from", env.savepoint, "--store-url", str(env.engine.url)]
    )
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    if case == "no credentials":
        assert "set [finalckpt] api_token" in result.stderr
    if case == "unreachable":
        assert "--no-graph-check" in result.stderr
    if case == "not the plugin":
        assert "answered text/html" in result.stderr and "not JSON" in result.stderr
        assert "with airflow-finalckpt installed there" in result.stderr
    assert _runs(dag_id) == []
    assert env.snapshot() == before


def test_rest_restore_refuses_then_plans_then_triggers(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from airflow_finalckpt.plugins.api import create_app

    dag = renamed_dag(f"rest_{uuid.uuid4().hex[:8]}")
    token = create_auth_manager().generate_jwt(SimpleAuthManagerUser(username="ann", role="ADMIN"))
    headers = {"Authorization": f"Bearer {token}"}
    control = PipelineControl(env.engine, env.storage)
    parent = FastAPI()
    parent.mount("/finalckpt", create_app(lambda: control))
    url = f"/finalckpt/api/dags/{dag.dag_id}/restore"
    before = env.snapshot()
    with TestClient(parent, base_url="http://airflow.test") as client:
        refused = client.post(url, json={"savepoint_path": env.savepoint}, headers=headers)
        assert refused.status_code == 409, refused.text
        assert "stage 'b' violates restore rule 'rekeyed-stage'" in refused.json()["detail"]
        bad = client.post(
            url, json={"savepoint_path": env.savepoint, "allow_drop_stages": "b"}, headers=headers
        )
        assert bad.status_code == 422
        body = {"savepoint_path": env.savepoint, "allow_drop_stages": ["b"]}
        dry = client.post(url, json={**body, "dry_run": True}, headers=headers)
        assert dry.status_code == 200, dry.text
        assert dry.json()["run_id"] is None
        assert dry.json()["plan"]["dropped_stages"] == ["b"]
        assert env.snapshot() == before
        with create_session() as session:
            assert session.query(DagRun).filter_by(dag_id=dag.dag_id).count() == 0

        made = client.post(url, json=body, headers=headers)
        assert made.status_code == 201, made.text
        run_id = made.json()["run_id"]
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag.dag_id, run_id=run_id).one()
        assert run.conf == {"restore_from": env.savepoint, "allow_drop_stages": ["b"]}
        assert "progress of b dropped on purpose" in (run.note or "")
    assert env.snapshot() == before  # the stage tasks do the restore, not the api-server


def test_run_note_names_the_dropped_stages() -> None:
    """The scheduler-side listener writes this note on the run's success (dag.test() hands the
    listener a detached DagRun, so the note itself is checked here)."""
    from airflow_finalckpt.listeners.dag_run_notes import drop_note

    note = drop_note({"pipeline_key": "k", "allow_drop_stages": ["b", "r"]})
    assert note is not None and note.startswith("allow_drop_stages: the progress of b, r ")
    assert drop_note({"pipeline_key": "k"}) is None
    assert drop_note({"allow_drop_stages": 5}) is None  # the stage tasks refuse that run
    assert drop_note(None) is None
