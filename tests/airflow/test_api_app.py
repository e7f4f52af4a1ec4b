"""The plugin's FastAPI app (REST + UI pages) with Airflow's real SimpleAuthManager tokens over a
real SQLite coordination store and real checkpoint storage.

Authentication and authorization are checked on every route; a refused request (401/403) and
every GET leave the store row-identical and the checkpoint storage file-identical.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, MetaData, event, select

from airflow_finalckpt.control import PipelineControl
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import EndOfData, StageSnapshot, StopMode, TriggerReason
from airflow_finalckpt.plugins.api import create_app
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

pytestmark = pytest.mark.usefixtures("airflow_home")

DAG = "flights"
RUN = "manual__run1"  # running, ingest partially finished
DRAINED_RUN = "manual__drained"  # a one-stage pipeline stopped with drain
OTHER_DAG = "secret_dag"
OTHER_RUN = "manual__other"
CSRF = {"X-Finalckpt-Request": "1"}


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def auth_manager() -> Any:
    from airflow.api_fastapi.app import create_auth_manager

    return create_auth_manager()


@pytest.fixture(scope="module")
def token(auth_manager: Any) -> Callable[..., str]:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    def make(role: str, *, name: str | None = None, expires: int = 3600) -> str:
        user = SimpleAuthManagerUser(username=name or role.lower(), role=role)
        return str(auth_manager.generate_jwt(user, expiration_time_in_seconds=expires))

    return make


def bearer(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


@dataclass
class Store:
    engine: Engine
    storage: CheckpointStorage
    control: PipelineControl
    root: Path
    main: Coordinator
    main_epoch: int

    def snapshot(self) -> tuple[Any, ...]:
        """Every row of every table, and every file (name, size, mtime) of the storage."""
        meta = MetaData()
        meta.reflect(self.engine)
        rows = {}
        with self.engine.connect() as conn:
            for name, table in sorted(meta.tables.items()):
                rows[name] = sorted(repr(tuple(r)) for r in conn.execute(select(table)))
        files = sorted(
            (str(p.relative_to(self.root)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in self.root.rglob("*")
            if p.is_file()
        )
        return rows, files


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    engine = make_engine(f"sqlite:///{tmp_path / 'coordination.db'}")
    ensure_schema(engine)
    root = tmp_path / "checkpoints"
    storage = CheckpointStorage(str(root))
    graph = StageGraph.build(
        [Stage("ingest", ()), Stage("enrich", ("ingest",)), Stage("publish", ("enrich",))]
    )
    main = Coordinator(engine, "flights.run1", writer=storage)
    main.register(graph)
    main.link_dag_run(DAG, RUN)
    view = main.start_attempt("ingest", total_splits=4)
    main.trigger(TriggerReason.MANUAL)
    main.record_batch("ingest", view.epoch, finished_splits=["d1", "d2"])

    drained = Coordinator(engine, "flights.drained", writer=storage)
    drained.register(StageGraph.build([Stage("only", ())]))
    drained.link_dag_run(DAG, DRAINED_RUN)
    only = drained.start_attempt("only", total_splits=1)
    drained.finish(
        "only",
        only.epoch,
        StageSnapshot(
            finished_splits=frozenset({"x"}), end_of_data=EndOfData(drain=True, manifest=["p0"])
        ),
    )
    drained.request_stop(StopMode.DRAIN, requested_by="setup")

    other = Coordinator(engine, "secret.run", writer=storage)
    other.register(StageGraph.build([Stage("s", ())]))
    other.link_dag_run(OTHER_DAG, OTHER_RUN)

    control = PipelineControl(engine, storage)
    yield Store(engine, storage, control, root, main, view.epoch)
    engine.dispose()


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    parent = FastAPI()
    parent.mount("/finalckpt", create_app(lambda: store.control))
    with TestClient(parent, base_url="http://airflow.test") as c:
        yield c


def api(path: str = "") -> str:
    return f"/finalckpt/api/dags/{DAG}/runs/{RUN}{path}"


GET_ROUTES = [
    "/finalckpt/api/runs",
    f"/finalckpt/api/runs?dag_id={DAG}",
    api(),
    api("/checkpoints"),
    f"/finalckpt/api/dags/{DAG}/runs/{DRAINED_RUN}",
    "/finalckpt/api/openapi.json",
    "/finalckpt/api/docs",
    "/finalckpt/ui/runs",
    "/finalckpt/ui/runs/live",
    f"/finalckpt/ui/dags/{DAG}/runs/{RUN}",
    f"/finalckpt/ui/dags/{DAG}/runs/{RUN}/live",
    "/finalckpt/static/finalckpt.js",
    "/finalckpt/static/finalckpt.css",
]
POST_ROUTES: list[tuple[str, dict[str, Any]]] = [
    (api("/stop"), {"mode": "savepoint"}),
    (api("/stop"), {"mode": "drain"}),
    (api("/resume"), {}),
    (api("/reset"), {"stage_id": "enrich"}),
    (f"/finalckpt/api/dags/{DAG}/restore", {"savepoint_path": "/nowhere/chk-1"}),
]


# ---------------------------------------------------------------------------------- authentication


def test_anonymous_gets_401_everywhere_and_nothing_changes(
    client: TestClient, store: Store
) -> None:
    before = store.snapshot()
    for path in GET_ROUTES:
        resp = client.get(path)
        assert resp.status_code == 401, (path, resp.text)
        assert resp.headers["www-authenticate"].startswith("Bearer"), path
    for path, body in POST_ROUTES:
        resp = client.post(path, json=body, headers=CSRF)
        assert resp.status_code == 401, (path, resp.text)
        assert "not authenticated" in resp.json()["detail"]
    assert store.snapshot() == before


def test_html_401_links_to_the_airflow_login(client: TestClient) -> None:
    resp = client.get(f"/finalckpt/ui/dags/{DAG}/runs/{RUN}")

    assert resp.status_code == 401
    assert resp.headers["content-type"].startswith("text/html")
    assert 'href="/auth/login' in resp.text and 'target="_top"' in resp.text


@pytest.mark.parametrize("kind", ["forged", "expired", "garbage", "not-bearer", "empty-bearer"])
def test_invalid_credentials_get_401_and_nothing_changes(
    client: TestClient, store: Store, token: Callable[..., str], kind: str
) -> None:
    if kind == "forged":  # right claims, wrong key
        claims = jwt.decode(token("ADMIN"), options={"verify_signature": False})
        headers = bearer(jwt.encode(claims, "not-the-airflow-secret" * 3, algorithm="HS512"))
    elif kind == "expired":
        headers = bearer(token("ADMIN", expires=-3600))
    elif kind == "garbage":
        headers = bearer("abc.def.ghi")
    elif kind == "not-bearer":
        headers = {"Authorization": "Basic YWRtaW46YWRtaW4="}
    else:
        headers = {"Authorization": "Bearer "}
    before = store.snapshot()

    for path in GET_ROUTES[:5]:
        assert client.get(path, headers=headers).status_code == 401, path
    for path, body in POST_ROUTES:
        resp = client.post(path, json=body, headers=headers)
        assert resp.status_code == 401, (path, resp.text)
        assert "WWW-Authenticate" in resp.headers
    # a bad cookie is no better than a bad header
    client.cookies.set("_token", "abc.def.ghi")
    try:
        assert client.post(api("/stop"), json={"mode": "drain"}, headers=CSRF).status_code == 401
    finally:
        client.cookies.clear()
    assert store.snapshot() == before
    if kind == "expired":
        assert "expired" in client.get(api(), headers=headers).json()["detail"]


# ---------------------------------------------------------------------------------- authorization


def test_viewer_reads_but_gets_403_on_every_change_and_nothing_changes(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    headers = bearer(token("VIEWER"))
    before = store.snapshot()

    assert client.get(api(), headers=headers).status_code == 200
    assert client.get("/finalckpt/api/runs", headers=headers).json()["total_entries"] == 3
    for path, body in POST_ROUTES:
        resp = client.post(path, json=body, headers=headers)
        assert resp.status_code == 403, (path, resp.text)
        assert "user 'viewer' may not" in resp.json()["detail"]
        assert DAG in resp.json()["detail"]
    assert store.snapshot() == before
    assert store.control.describe(DAG, RUN).summary.stop is None


def test_a_user_without_any_role_is_refused_reading(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    nobody = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="nobody", role=None))
    before = store.snapshot()

    assert client.get(api(), headers=bearer(nobody)).status_code == 403
    assert (
        client.get(f"/finalckpt/ui/dags/{DAG}/runs/{RUN}", headers=bearer(nobody)).status_code
        == 403
    )
    assert client.get("/finalckpt/api/runs", headers=bearer(nobody)).json()["runs"] == []
    assert store.snapshot() == before


def test_listing_shows_only_dags_the_user_may_read(
    client: TestClient, token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SimpleAuthManager has no per-DAG rules; the listing asks the auth manager per DAG."""
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    original = manager.is_authorized_dag

    def per_dag(**kwargs: Any) -> bool:
        if kwargs["details"].id == OTHER_DAG and kwargs["user"].get_name() == "viewer":
            return False
        return bool(original(**kwargs))

    monkeypatch.setattr(manager, "is_authorized_dag", per_dag)
    viewer, admin = bearer(token("VIEWER")), bearer(token("ADMIN"))

    seen = {
        r["pipeline_key"] for r in client.get("/finalckpt/api/runs", headers=viewer).json()["runs"]
    }
    assert seen == {"flights.run1", "flights.drained"}
    all_keys = client.get("/finalckpt/api/runs", headers=admin).json()["runs"]
    assert {r["pipeline_key"] for r in all_keys} == seen | {"secret.run"}
    assert "secret.run" not in client.get("/finalckpt/ui/runs", headers=viewer).text
    resp = client.get(f"/finalckpt/api/runs?dag_id={OTHER_DAG}", headers=viewer)
    assert resp.status_code == 403
    resp = client.get(f"/finalckpt/api/dags/{OTHER_DAG}/runs/{OTHER_RUN}", headers=viewer)
    assert resp.status_code == 403


def test_get_routes_never_change_state(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    headers = bearer(token("ADMIN"))
    before = store.snapshot()
    for _ in range(2):
        for path in GET_ROUTES:
            resp = client.get(path, headers=headers)
            assert resp.status_code == 200, (path, resp.text)
    # unknown runs and HEAD-like probes neither
    assert client.get(api().replace(RUN, "nope"), headers=headers).status_code == 404
    assert store.snapshot() == before


def test_get_cannot_be_used_to_change_state(client: TestClient, token: Callable[..., str]) -> None:
    headers = bearer(token("ADMIN"))
    for path, _ in POST_ROUTES:
        assert client.get(path, headers=headers).status_code == 405, path


# ---------------------------------------------------------------------------------- CSRF


def test_cookie_session_works_for_reads_and_needs_the_csrf_header_for_changes(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    client.cookies.set("_token", token("USER", name="alice"))
    try:
        assert client.get(api()).status_code == 200
        before = store.snapshot()
        resp = client.post(api("/stop"), json={"mode": "savepoint"})
        assert resp.status_code == 403 and "X-Finalckpt-Request" in resp.json()["detail"]
        resp = client.post(
            api("/stop"),
            json={"mode": "savepoint"},
            headers={**CSRF, "Origin": "https://evil.example"},
        )
        assert resp.status_code == 403 and "origin" in resp.json()["detail"]
        resp = client.post(
            api("/stop"),
            json={"mode": "savepoint"},
            headers={**CSRF, "Sec-Fetch-Site": "cross-site"},
        )
        assert resp.status_code == 403
        assert store.snapshot() == before

        resp = client.post(
            api("/stop"),
            json={"mode": "savepoint"},
            headers={**CSRF, "Origin": "http://airflow.test", "Sec-Fetch-Site": "same-origin"},
        )
        assert resp.status_code == 202, resp.text
        assert resp.json()["requested_by"] == "alice"
    finally:
        client.cookies.clear()


def test_a_forged_forwarded_host_does_not_pass_the_origin_check(
    client: TestClient, store: Store, token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: a client-supplied X-Forwarded-Host naming the foreign Origin once made it
    look like the UI's own; it counts only when [finalckpt] trust_forwarded_host says a proxy
    sets it, and Airflow's [api] base_url names the UI's host behind a proxy."""
    forged = {**CSRF, "Origin": "https://evil.example", "X-Forwarded-Host": "evil.example"}
    public = {**CSRF, "Origin": "https://airflow.example.org"}
    monkeypatch.delenv("AIRFLOW__FINALCKPT__TRUST_FORWARDED_HOST", raising=False)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.org/")
    client.cookies.set("_token", token("USER", name="alice"))
    try:
        before = store.snapshot()
        resp = client.post(api("/stop"), json={"mode": "savepoint"}, headers=forged)
        assert resp.status_code == 403, resp.text
        assert "origin 'https://evil.example' refused" in resp.json()["detail"]
        assert store.snapshot() == before
        monkeypatch.setenv("AIRFLOW__FINALCKPT__TRUST_FORWARDED_HOST", "true")
        proxied = {**CSRF, "Origin": "https://proxy.example", "X-Forwarded-Host": "proxy.example"}
        resp = client.post(api("/stop"), json={"mode": "savepoint"}, headers=proxied)
        assert resp.status_code == 202, resp.text
        resp = client.post(api("/resume"), headers=public)
        assert resp.status_code != 403, resp.text
    finally:
        client.cookies.clear()


def test_bearer_token_wins_over_the_cookie(client: TestClient, token: Callable[..., str]) -> None:
    client.cookies.set("_token", token("ADMIN"))
    try:
        resp = client.post(api("/stop"), json={"mode": "drain"}, headers=bearer(token("VIEWER")))
        assert resp.status_code == 403
    finally:
        client.cookies.clear()


# ---------------------------------------------------------------------------------- behaviour


def test_stop_with_savepoint_then_resume(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    headers = bearer(token("USER", name="bob"))

    resp = client.post(api("/stop"), json={"mode": "savepoint"}, headers=headers)
    assert resp.status_code == 202, resp.text
    stop = resp.json()
    assert stop["mode"] == "savepoint" and stop["state"] == "REQUESTED"
    assert stop["requested_by"] == "bob"
    assert client.get(api(), headers=headers).json()["summary"]["state"] == "stopping"

    again = client.post(api("/stop"), json={"mode": "drain"}, headers=headers)
    assert again.status_code == 409 and "already stopping" in again.json()["detail"]
    early = client.post(api("/resume"), headers=headers)
    assert early.status_code == 409 and "still in progress" in early.json()["detail"]

    # the running stage answers at its batch boundary and suspends
    store.main.record_batch("ingest", store.main_epoch, finished_splits=["d3"])
    store.main.suspend("ingest", store.main_epoch)
    detail = client.get(api(), headers=headers).json()
    assert detail["summary"]["state"] == "suspended"
    assert detail["summary"]["stop"]["savepoint_path"].endswith("/_metadata")
    stop_again = client.post(api("/stop"), json={"mode": "savepoint"}, headers=headers)
    assert stop_again.status_code == 409 and "resume it first" in stop_again.json()["detail"]

    resumed = client.post(api("/resume"), headers=headers)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["state"] == "RESUMED"
    assert client.get(api(), headers=headers).json()["summary"]["state"] == "running"
    not_suspended = client.post(api("/resume"), headers=headers)
    assert not_suspended.status_code == 409 and "not suspended" in not_suspended.json()["detail"]


def test_drained_run_cannot_be_stopped_resumed_or_restored(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    headers = bearer(token("ADMIN"))
    run = f"/finalckpt/api/dags/{DAG}/runs/{DRAINED_RUN}"
    detail = client.get(run, headers=headers).json()
    assert detail["summary"]["state"] == "drained"
    path = detail["summary"]["stop"]["savepoint_path"]

    stop = client.post(f"{run}/stop", json={"mode": "savepoint"}, headers=headers)
    assert stop.status_code == 409 and "already drained" in stop.json()["detail"]
    resume = client.post(f"{run}/resume", headers=headers)
    assert resume.status_code == 409 and "cannot be resumed" in resume.json()["detail"]
    restore = client.post(
        f"/finalckpt/api/dags/{DAG}/restore", json={"savepoint_path": path}, headers=headers
    )
    assert restore.status_code == 409 and "drained savepoint" in restore.json()["detail"]


def test_unknown_run_is_404_with_a_message(client: TestClient, token: Callable[..., str]) -> None:
    headers = bearer(token("ADMIN"))
    # the run's detail (the page's poll) says what is missing: here the DAG itself
    resp = client.get(api().replace(RUN, "nope"), headers=headers)
    assert resp.status_code == 404 and resp.json()["detail"] == f"DAG {DAG!r} not found"
    for method, path, body in [
        ("GET", api("/checkpoints").replace(RUN, "nope"), None),
        ("POST", api("/stop").replace(RUN, "nope"), {"mode": "drain"}),
        ("POST", api("/resume").replace(RUN, "nope"), {}),
    ]:
        resp = client.request(method, path, json=body, headers=headers)
        assert resp.status_code == 404, (path, resp.text)
        assert "no pipeline run is known for DAG run 'nope'" in resp.json()["detail"]
    page = client.get(f"/finalckpt/ui/dags/{DAG}/runs/nope", headers=headers)
    assert page.status_code == 404 and "no pipeline run is known" in page.text
    assert 'data-live-url="/finalckpt/ui/dags/flights/runs/nope/live"' in page.text


@pytest.mark.parametrize(
    "body",
    [{"mode": "pause"}, {}, {"mode": "drain", "force": True}, None],
    ids=["bad-mode", "no-mode", "extra-field", "no-body"],
)
def test_bad_stop_body_is_422_and_changes_nothing(
    client: TestClient, store: Store, token: Callable[..., str], body: Any
) -> None:
    before = store.snapshot()
    resp = client.post(api("/stop"), json=body, headers=bearer(token("ADMIN")))
    assert resp.status_code == 422
    assert resp.json()["detail"].startswith("invalid request: ")
    assert store.snapshot() == before
    if body == {"mode": "pause"}:
        assert "mode: Input should be 'drain' or 'savepoint'" in resp.json()["detail"]


def test_restore_validates_then_triggers_a_run(
    client: TestClient, store: Store, token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_finalckpt.plugins.api import routes

    headers = bearer(token("USER", name="carol"))
    path = client.get(api(), headers=headers).json()["checkpoints"][0]["metadata_path"]

    assert (
        client.post(f"/finalckpt/api/dags/{DAG}/restore", json={}, headers=headers).status_code
        == 422
    )
    unreadable = client.post(
        f"/finalckpt/api/dags/{DAG}/restore",
        json={"savepoint_path": str(store.root / "flights.run1" / "chk-99")},
        headers=headers,
    )
    assert unreadable.status_code == 422 and "no checkpoint metadata" in unreadable.json()["detail"]
    foreign = client.post(
        f"/finalckpt/api/dags/{OTHER_DAG}/restore", json={"savepoint_path": path}, headers=headers
    )
    assert foreign.status_code == 409 and "not of DAG 'secret_dag'" in foreign.json()["detail"]
    # the DAG is not in Airflow's metadata database: Airflow's own trigger says so
    missing = client.post(
        f"/finalckpt/api/dags/{DAG}/restore", json={"savepoint_path": path}, headers=headers
    )
    assert missing.status_code == 404 and "DAG 'flights' not found" in missing.json()["detail"]

    _serialize_flights_dag()
    calls: list[tuple[str, str, str]] = []

    def fake_trigger(dag_id: str, savepoint_path: str, principal: Any, **_: Any) -> str:
        calls.append((dag_id, savepoint_path, principal.name))
        return "restore__1"

    monkeypatch.setattr(routes, "trigger_restore_run", fake_trigger)
    resp = client.post(
        f"/finalckpt/api/dags/{DAG}/restore", json={"savepoint_path": path}, headers=headers
    )
    assert resp.status_code == 201, resp.text
    doc = resp.json()
    plan = doc.pop("plan")
    assert doc == {
        "dag_id": DAG,
        "run_id": "restore__1",
        "savepoint_path": path,
        "checkpoint_id": 1,
        "kind": "checkpoint",
        "pipeline_key": "flights.run1",
        "allow_drop_stages": [],
        "mode": "restore",
    }
    assert (plan["resumed"], plan["fresh"]) == (["ingest"], ["enrich", "publish"])
    assert calls == [(DAG, path, "carol")]


def _serialize_flights_dag() -> None:
    """The DAG ``flights`` (ingest -> enrich -> publish) in Airflow's metadata database, as
    the DAG processor would put it: the restore check reads its graph from there."""
    from datetime import datetime

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.sdk import DAG as AirflowDAG
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator

    with AirflowDAG(DAG, schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        ingest, enrich, publish = (
            FinalCheckpointStageOperator(task_id=t, transform=lambda c: None)
            for t in ("ingest", "enrich", "publish")
        )
        ingest >> enrich >> publish
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


# ---------------------------------------------------------------------------------- pages


def test_pipeline_page_shows_state_graph_history_and_buttons(
    client: TestClient, token: Callable[..., str]
) -> None:
    html = client.get(f"/finalckpt/ui/dags/{DAG}/runs/{RUN}", headers=bearer(token("USER"))).text

    assert 'data-run-state="running"' in html
    assert '<svg class="stage-graph"' in html
    assert 'data-stage-id="ingest" data-status="PARTIALLY_FINISHED" data-progress="2/4"' in html
    assert 'data-stage-id="enrich" data-status="NOT_STARTED" data-progress="0/?"' in html
    assert html.count('class="edge"') == 2
    assert 'data-checkpoint-id="1" data-kind="checkpoint" data-state="COMPLETED"' in html
    for label in ("Stop with drain", "Stop with savepoint", "Resume"):
        assert f'data-label="{label}"' in html
    assert 'data-mode="resume" data-label="Resume" disabled' in html
    assert 'data-mode="drain" data-label="Stop with drain">' in html
    assert '<dialog id="confirm">' in html
    assert 'data-live-url="/finalckpt/ui/dags/flights/runs/manual__run1/live"' in html
    assert 'data-api="/finalckpt/api/dags/flights/runs/manual__run1"' in html
    assert 'src="/finalckpt/static/finalckpt.js"' in html


def test_pipeline_page_shows_a_running_stage_s_latest_batch(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    from airflow_finalckpt.core.batching import BatchSample, fit
    from airflow_finalckpt.storage.hints import StorageThroughputHints

    model = fit([BatchSample(1, 1.0, 2.0), BatchSample(9, 9.0, 6.0)])
    assert model is not None
    StorageThroughputHints(store.storage, "dag-flights", store.main.pipeline_key).save(
        "ingest", model
    )
    html = client.get(f"/finalckpt/ui/dags/{DAG}/runs/{RUN}", headers=bearer(token("VIEWER"))).text
    assert "; last batch 9 splits in 6.0s, 2.00 splits/s + 1.50s per batch</title>" in html
    doc = client.get(api(), headers=bearer(token("VIEWER"))).json()
    batches = {s["stage_id"]: s["batches"] for s in doc["stages"]}
    assert batches.pop("ingest") == "last batch 9 splits in 6.0s, 2.00 splits/s + 1.50s per batch"
    assert set(batches.values()) == {None}  # stages that are not running show none


def test_page_escapes_ids(client: TestClient, store: Store, token: Callable[..., str]) -> None:
    evil_dag, evil_run = "d<script>", 'r"><img src=x>'
    coord = Coordinator(store.engine, "evil", writer=store.storage)
    coord.register(StageGraph.build([Stage("s", ())]))
    coord.link_dag_run(evil_dag, evil_run)
    from urllib.parse import quote

    resp = client.get(
        f"/finalckpt/ui/dags/{quote(evil_dag, safe='')}/runs/{quote(evil_run, safe='')}",
        headers=bearer(token("ADMIN")),
    )
    assert resp.status_code == 200
    assert "<script>" not in resp.text.replace('<script defer src="/finalckpt/static/', "")
    assert "<img src=x>" not in resp.text and "d&lt;script&gt;" in resp.text


def test_openapi_documents_routes_tags_and_errors(
    client: TestClient, token: Callable[..., str]
) -> None:
    doc = client.get("/finalckpt/api/openapi.json", headers=bearer(token("VIEWER"))).json()

    paths = doc["paths"]
    stop = paths["/api/dags/{dag_id}/runs/{run_id}/stop"]["post"]
    assert stop["tags"] == ["Stop and resume"]
    assert {"202", "401", "403", "404", "409", "422"} <= set(stop["responses"])
    assert "ErrorDetail" in doc["components"]["schemas"]
    assert set(paths) >= {
        "/api/runs",
        "/api/dags/{dag_id}/runs/{run_id}",
        "/api/dags/{dag_id}/runs/{run_id}/checkpoints",
        "/api/dags/{dag_id}/runs/{run_id}/resume",
        "/api/dags/{dag_id}/restore",
    }
    assert all(
        op in ("get",) for route, ops in paths.items() if route.startswith("/ui") for op in ops
    )


def test_live_fragment_reads_do_not_grow_with_the_checkpoint_history(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    """The page refreshes every 2 s: its fragment must stay cheap however long the run is (a
    fixed number of statements, not one per checkpoint or per stage snapshot)."""
    headers = bearer(token("VIEWER"))
    url = f"/finalckpt/ui/dags/{DAG}/runs/{RUN}/live"
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(str(args[2]))

    def statements_for_one_refresh() -> int:
        statements.clear()
        event.listen(store.engine, "before_cursor_execute", count)
        try:
            assert client.get(url, headers=headers).status_code == 200
        finally:
            event.remove(store.engine, "before_cursor_execute", count)
        return len(statements)

    short = statements_for_one_refresh()
    for i in range(12):  # twelve more completed checkpoints of the running ingest
        store.main.trigger(TriggerReason.MANUAL)
        store.main.record_batch("ingest", store.main_epoch, finished_splits=[f"d{i + 3}"])
    assert len(store.main.checkpoints()) >= 13
    assert statements_for_one_refresh() == short


def test_reset_forgets_the_stage_and_its_downstream_and_names_the_tasks_to_clear(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    headers = bearer(token("OP"))
    before = store.main.stages()

    resp = client.post(api("/reset"), json={"stage_id": "ingest"}, headers=headers)

    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["reset_stages"] == ["ingest", "enrich", "publish"]
    assert doc["requested_by"] == "op"
    assert "clear tasks ingest, enrich, publish" in doc["next_step"]
    after = store.main.stages()
    assert after["ingest"].progress.finished_splits == frozenset()
    assert before["ingest"].progress.finished_splits == frozenset({"d1", "d2"})
    assert after["ingest"].epoch == before["ingest"].epoch + 1  # a running attempt is fenced
    unknown = client.post(api("/reset"), json={"stage_id": "nope"}, headers=headers)
    assert unknown.status_code == 404
    assert "has no stage 'nope'" in unknown.json()["detail"]
    assert client.post(api("/reset"), json={}, headers=headers).status_code == 422


def test_pipeline_page_has_a_recompute_button_per_stage(
    client: TestClient, token: Callable[..., str]
) -> None:
    page = client.get(f"/finalckpt/ui/dags/{DAG}/runs/{RUN}", headers=bearer(token("USER")))

    assert page.status_code == 200
    for stage in ("ingest", "enrich", "publish"):
        assert f'data-action="reset" data-stage="{stage}"' in page.text


def test_a_viewer_s_page_shows_no_action_the_viewer_may_not_take(
    client: TestClient, store: Store, token: Callable[..., str]
) -> None:
    """Stop, resume and recompute need permission to edit the DAG's runs: a viewer's page and
    its live fragment draw none of their buttons (the routes answer 403 anyway:
    test_viewer_reads_but_gets_403_on_every_change_and_nothing_changes)."""
    page = f"/finalckpt/ui/dags/{DAG}/runs/{RUN}"
    for url in (page, page + "/live"):
        viewer = client.get(url, headers=bearer(token("VIEWER")))
        user = client.get(url, headers=bearer(token("USER")))
        assert viewer.status_code == user.status_code == 200
        assert "data-action=" not in viewer.text, url
        assert "Read only: stopping, resuming and recomputing need permission" in viewer.text
        assert 'data-stage-id="ingest"' in viewer.text  # the rest is drawn
        for action in ('data-action="stop"', 'data-action="resume"', 'data-action="reset"'):
            assert action in user.text, (url, action)
        assert "Read only" not in user.text


# ---------------------------------------------------------------------------------- audit log


def audit_rows(after: int = 0) -> list[dict[str, Any]]:
    """The plugin's rows of Airflow's audit log (the ``log`` table), oldest first."""
    from airflow.models import Log
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            select(Log).where(Log.event.like("finalckpt.%"), Log.id > after).order_by(Log.id)
        ).all()
        return [
            {
                "event": r.event,
                "owner": r.owner,
                "dag_id": r.dag_id,
                "run_id": r.run_id,
                "extra": json.loads(r.extra or "{}"),
            }
            for r in rows
        ]


@pytest.fixture
def audit_start() -> int:
    """The last audit log row before the test (the metadata database is shared)."""
    from airflow.models import Log
    from airflow.utils.session import create_session
    from sqlalchemy import func

    with create_session() as session:
        return int(session.scalar(select(func.max(Log.id))) or 0)


def test_stop_resume_and_reset_are_in_airflow_s_audit_log_with_user_run_and_result(
    client: TestClient, store: Store, token: Callable[..., str], audit_start: int
) -> None:
    headers = bearer(token("USER", name="dora"))
    stop = client.post(api("/stop"), json={"mode": "savepoint"}, headers=headers)
    assert stop.status_code == 202, stop.text
    assert client.post(api("/stop"), json={"mode": "drain"}, headers=headers).status_code == 409
    store.main.record_batch("ingest", store.main_epoch, finished_splits=["d3"])
    store.main.suspend("ingest", store.main_epoch)
    cookie = {"Cookie": f"_token={token('USER', name='dora')}", **CSRF}
    assert client.post(api("/resume"), headers=cookie).status_code == 200
    reset = client.post(api("/reset"), json={"stage_id": "publish"}, headers=headers)
    assert reset.status_code == 200, reset.text
    # refused by authorization or validation before the route runs: not recorded, as in
    # Airflow's own routes
    viewer = bearer(token("VIEWER"))
    assert client.post(api("/stop"), json={"mode": "drain"}, headers=viewer).status_code == 403
    assert client.post(api("/stop"), json={"mode": "x"}, headers=headers).status_code == 422

    rows = audit_rows(audit_start)
    assert [(r["event"], r["owner"], r["dag_id"], r["run_id"]) for r in rows] == [
        ("finalckpt.stop", "dora", DAG, RUN),
        ("finalckpt.stop", "dora", DAG, RUN),
        ("finalckpt.resume", "dora", DAG, RUN),
        ("finalckpt.reset", "dora", DAG, RUN),
    ]
    accepted, refused, resumed, recomputed = (r["extra"] for r in rows)
    assert accepted == {
        "mode": "savepoint",
        "auth": "bearer",
        "method": "POST",
        "result": "accepted",
        "stop_request_id": stop.json()["request_id"],
        "state": "REQUESTED",
        **({"savepoint_id": stop.json()["savepoint_id"]} if stop.json()["savepoint_id"] else {}),
    }
    assert refused["result"] == "refused" and refused["status_code"] == 409
    assert refused["mode"] == "drain" and "already stopping" in refused["detail"]
    assert resumed["result"] == "accepted" and resumed["state"] == "RESUMED"
    assert resumed["auth"] == "cookie"
    assert recomputed["result"] == "accepted" and recomputed["stage_id"] == "publish"
    assert recomputed["reset_stages"] == ["publish"]


def test_a_change_that_cannot_be_audited_is_not_made(
    client: TestClient, store: Store, token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_finalckpt.plugins.api import audit

    def metadata_db_down(*_: Any) -> int:
        raise ConnectionError("metadata database unreachable")

    monkeypatch.setattr(audit, "_insert", metadata_db_down)
    before = store.snapshot()
    headers = bearer(token("USER"))
    for path, body in POST_ROUTES:
        resp = client.post(path, json=body, headers=headers)
        assert resp.status_code == 503, (path, resp.text)
        assert "could not be recorded in Airflow's audit log" in resp.json()["detail"]
    assert store.snapshot() == before


def test_restores_are_in_the_audit_log_with_the_new_run_and_dry_runs_are_not(
    client: TestClient,
    store: Store,
    token: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    audit_start: int,
) -> None:
    from airflow_finalckpt.plugins.api import routes

    headers = bearer(token("USER", name="erin"))
    path = client.get(api(), headers=headers).json()["checkpoints"][0]["metadata_path"]
    restore = f"/finalckpt/api/dags/{DAG}/restore"
    drained = client.get(f"/finalckpt/api/dags/{DAG}/runs/{DRAINED_RUN}", headers=headers).json()
    drained_path = drained["summary"]["stop"]["savepoint_path"]
    assert (
        client.post(restore, json={"savepoint_path": drained_path}, headers=headers).status_code
        == 409
    )
    dry = client.post(restore, json={"savepoint_path": path, "dry_run": True}, headers=headers)
    assert dry.status_code == 200, dry.text
    monkeypatch.setattr(routes, "trigger_restore_run", lambda *a, **k: "restore__7")
    done = client.post(restore, json={"savepoint_path": path}, headers=headers)
    assert done.status_code == 201, done.text

    rows = audit_rows(audit_start)
    assert [(r["event"], r["owner"], r["dag_id"], r["run_id"]) for r in rows] == [
        ("finalckpt.restore", "erin", DAG, None),
        ("finalckpt.restore", "erin", DAG, "restore__7"),
    ]
    refused, accepted = (r["extra"] for r in rows)
    assert refused["result"] == "refused" and refused["status_code"] == 409
    assert refused["savepoint_path"] == drained_path and "drained" in refused["detail"]
    assert accepted == {
        "savepoint_path": path,
        "allow_drop_stages": [],
        "auth": "bearer",
        "method": "POST",
        "result": "accepted",
        "checkpoint_id": 1,
        "mode": "restore",
    }


# ---------------------------------------------------------------------------------- the CLI


@pytest.fixture
def cli_over_app(
    client: TestClient, token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Any]:
    """``finalckpt ...`` in this process, its API client talking to the app under test; the
    store URL points nowhere, so a command that touched the store itself would fail."""
    from click.testing import CliRunner

    from airflow_finalckpt.cli import airflow_api
    from airflow_finalckpt.cli.main import main

    class AppApi(airflow_api.AirflowApi):
        def __init__(self, settings: Any, **kwargs: Any) -> None:
            super().__init__(settings, **kwargs)
            self._client.close()
            self._client = client

        def close(self) -> None:  # the fixture's client outlives one command
            pass

    monkeypatch.setattr(airflow_api, "AirflowApi", AppApi)
    monkeypatch.setenv("AIRFLOW__FINALCKPT__API_URL", "http://airflow.test")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", "sqlite:////nonexistent/dir/store.db")

    def run(role: str, name: str, *args: str) -> Any:
        monkeypatch.setenv("AIRFLOW__FINALCKPT__API_TOKEN", token(role, name=name))
        return CliRunner().invoke(main, list(args))

    return run


def test_the_cli_goes_through_the_api_server_by_default(
    cli_over_app: Callable[..., Any], store: Store, audit_start: int
) -> None:
    import threading

    before = store.snapshot()
    denied = cli_over_app("VIEWER", "vera", "stop", DAG, RUN, "--savepoint")
    assert denied.exit_code == 2
    assert "Airflow refused to stop DAG run 'manual__run1' of 'flights'" in denied.stderr
    assert "user 'vera' may not edit the runs of DAG 'flights'" in denied.stderr
    direct = cli_over_app("USER", "fred", "stop", DAG, RUN, "--drain", "--store-url", "sqlite://")
    assert direct.exit_code == 2 and "add --direct-store (admin only" in direct.stderr
    unknown = cli_over_app("USER", "fred", "resume", DAG, "nope")
    assert (
        unknown.exit_code == 2 and "no pipeline run is known for DAG run 'nope'" in unknown.stderr
    )
    assert store.snapshot() == before

    def answer_the_savepoint() -> None:  # the running stage, at its next batch boundary
        while store.main.stop_request() is None:
            threading.Event().wait(0.05)
        store.main.record_batch("ingest", store.main_epoch, finished_splits=["d3"])
        store.main.suspend("ingest", store.main_epoch)

    stage = threading.Thread(target=answer_the_savepoint, daemon=True)
    stage.start()
    stopped = cli_over_app("USER", "fred", "stop", DAG, RUN, "--savepoint", "--wait")
    stage.join(timeout=60)
    assert stopped.exit_code == 0, stopped.stderr
    first, second = stopped.stdout.splitlines()[:2]
    assert "stop with savepoint #" in first and ": REQUESTED, savepoint" in first
    assert ": COMPLETED, savepoint" in second and second.endswith("/_metadata")
    status = cli_over_app("VIEWER", "vera", "status", DAG, RUN, "--json")
    assert status.exit_code == 0, status.stderr
    assert json.loads(status.stdout)["summary"]["state"] == "suspended"
    again = cli_over_app("USER", "fred", "stop", DAG, RUN, "--drain")
    assert again.exit_code == 2 and "resume it first" in again.stderr
    resumed = cli_over_app("USER", "fred", "resume", DAG, RUN, "--json")
    assert resumed.exit_code == 0, resumed.stderr
    assert json.loads(resumed.stdout)["requested_by"] == "fred"
    reset = cli_over_app("USER", "fred", "reset", DAG, RUN, "--stage", "publish")
    assert reset.exit_code == 0, reset.stderr
    assert "reset stages publish of pipeline flights.run1" in reset.stdout

    stop = store.main.stop_request()
    assert stop is not None and stop.requested_by == "fred"
    rows = audit_rows(audit_start)
    assert [(r["event"], r["owner"], r["run_id"], r["extra"]["result"]) for r in rows] == [
        ("finalckpt.resume", "fred", "nope", "refused"),  # 404: the route ran
        ("finalckpt.stop", "fred", RUN, "accepted"),
        ("finalckpt.stop", "fred", RUN, "refused"),
        ("finalckpt.resume", "fred", RUN, "accepted"),
        ("finalckpt.reset", "fred", RUN, "accepted"),
    ]
