"""The Pipelines list's route (``GET /finalckpt/api/runs``: search, state filter, sort, server-side
paging, counts), the page's access route, the 404 that tells a missing DAG, run or pipeline
apart, the 401's login link and the React bundle's route: through the plugin's FastAPI app with
Airflow's SimpleAuthManager tokens over a real SQLite store seeded with 60 pipelines."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_finalckpt.control import PipelineControl
from airflow_finalckpt.plugins.api import create_app
from airflow_finalckpt.plugins.api import dags as dags_module
from airflow_finalckpt.plugins.finalckpt_plugin import bundle_built
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from tests.ui_seed import Seeded, seed_pipelines

pytestmark = pytest.mark.usefixtures("airflow_home")

DAGS = ("flights", "hotels", "secret_dag")
COUNT = 60


@pytest.fixture(scope="module")
def token() -> Callable[..., str]:
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    manager = create_auth_manager()

    def make(role: str | None, name: str | None = None) -> str:
        user = SimpleAuthManagerUser(username=name or (role or "nobody").lower(), role=role)
        return str(manager.generate_jwt(user))

    return make


def bearer(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PipelineControl, Seeded]]:
    root: Path = tmp_path_factory.mktemp("list")
    engine = make_engine(f"sqlite:///{root / 'coordination.db'}")
    ensure_schema(engine)
    storage = CheckpointStorage(str(root / "checkpoints"))
    seeded = seed_pipelines(engine, storage, COUNT, DAGS, "p")
    yield PipelineControl(engine, storage), seeded
    engine.dispose()


@pytest.fixture
def client(seeded: tuple[PipelineControl, Seeded]) -> Iterator[TestClient]:
    parent = FastAPI()
    parent.mount("/finalckpt", create_app(lambda: seeded[0]))
    with TestClient(parent, base_url="http://airflow.test") as c:
        yield c


@pytest.fixture
def viewer_cannot_read_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """SimpleAuthManager has no per-DAG rules: the viewer may not read ``secret_dag``."""
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    original = manager.is_authorized_dag

    def per_dag(**kwargs: Any) -> bool:
        if kwargs["details"].id == "secret_dag" and kwargs["user"].get_name() == "viewer":
            return False
        return bool(original(**kwargs))

    monkeypatch.setattr(manager, "is_authorized_dag", per_dag)


def runs(client: TestClient, tok: str, query: str = "") -> dict[str, Any]:
    resp = client.get(f"/finalckpt/api/runs?{query}", headers=bearer(tok))
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_pages_cover_every_readable_run_once_with_the_total(
    client: TestClient, token: Callable[..., str], viewer_cannot_read_secret: None
) -> None:
    viewer = token("VIEWER")
    seen: list[str] = []
    for offset in range(0, 40, 15):
        page = runs(client, viewer, f"limit=15&offset={offset}")
        assert page["total_entries"] == 40  # 20 runs of secret_dag hidden
        assert (page["limit"], page["offset"]) == (15, offset)
        seen += [r["pipeline_key"] for r in page["runs"]]
    assert len(seen) == len(set(seen)) == 40
    assert all(r.split(".")[1] and int(r.split(".")[1]) % 3 != 2 for r in seen)  # no secret_dag
    assert runs(client, token("ADMIN"), "limit=1")["total_entries"] == COUNT


def test_search_state_filter_counts_and_sort(
    client: TestClient, token: Callable[..., str], seeded: tuple[PipelineControl, Seeded]
) -> None:
    admin = token("ADMIN")
    hotels = runs(client, admin, "q=hotels&limit=500")
    assert hotels["total_entries"] == len(seeded[1].runs["hotels"]) == 20
    assert {r["dag_runs"][0][0] for r in hotels["runs"]} == {"hotels"}
    one = runs(client, admin, "q=p__0007")
    assert [r["pipeline_key"] for r in one["runs"]] == ["p.0007"]

    counts = runs(client, admin, "limit=1")["state_counts"]
    assert {k: v for k, v in counts.items() if v} == dict(seeded[1].states)
    finished = runs(client, admin, "state=finished&state=draining&limit=500")
    assert finished["total_entries"] == counts["finished"] + counts["draining"]
    assert {r["state"] for r in finished["runs"]} == {"finished", "draining"}
    assert finished["state_counts"] == counts  # counts are before the state filter

    by_key = runs(client, admin, "sort=key&order=asc&limit=3")["runs"]
    assert [r["pipeline_key"] for r in by_key] == ["p.0000", "p.0001", "p.0002"]
    newest = runs(client, admin, "limit=2")["runs"]
    assert [r["pipeline_key"] for r in newest] == ["p.0059", "p.0058"]
    first = newest[0]
    assert first["started_at"] is not None and first["ended_at"] is None  # running


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=501", "offset=-1", "state=paused", "sort=size", "order=up"],
)
def test_bad_list_queries_are_422(
    client: TestClient, token: Callable[..., str], query: str
) -> None:
    resp = client.get(f"/finalckpt/api/runs?{query}", headers=bearer(token("ADMIN")))
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"].startswith("invalid request: query.")


def test_access_says_which_buttons_the_user_may_press(
    client: TestClient, token: Callable[..., str], viewer_cannot_read_secret: None
) -> None:
    path = "/finalckpt/api/dags/flights/access"
    assert client.get(path, headers=bearer(token("VIEWER"))).json() == {
        "dag_id": "flights",
        "can_edit": False,
        "can_restore": False,
    }
    op = client.get(path, headers=bearer(token("OP"))).json()
    assert op["can_edit"] and op["can_restore"]
    secret = client.get("/finalckpt/api/dags/secret_dag/access", headers=bearer(token("VIEWER")))
    assert secret.status_code == 403
    assert client.get(path).status_code == 401


@pytest.mark.parametrize(
    ("known", "state", "reason", "words"),
    [
        (False, None, "dag", "DAG 'flights' not found"),
        (True, None, "run", "DAG run 'nope' of DAG 'flights' not found"),
        (True, "queued", "not_started", "none of its pipeline stages has started yet"),
        (True, "success", "no_pipeline", "is success and ran no pipeline stage"),
    ],
)
def test_a_missing_pipeline_says_what_is_missing(
    client: TestClient,
    token: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    known: bool,
    state: str | None,
    reason: str,
    words: str,
) -> None:
    monkeypatch.setattr(dags_module, "dag_run_state", lambda dag_id, run_id: (known, state))
    resp = client.get("/finalckpt/api/dags/flights/runs/nope", headers=bearer(token("ADMIN")))
    assert resp.status_code == 404
    assert words in resp.json()["detail"]
    assert resp.headers["X-Finalckpt-Reason"] == reason


def test_the_dag_run_lookup_reads_airflow_s_database() -> None:
    """No DAG and no run in the (migrated, empty) metadata database of the test home."""
    assert dags_module.dag_run_state("no_such_dag", "no_such_run") == (False, None)


def test_a_401_names_the_login_page(client: TestClient) -> None:
    resp = client.get("/finalckpt/api/runs")
    assert resp.status_code == 401
    from airflow.api_fastapi.app import get_auth_manager

    assert resp.headers["X-Finalckpt-Login"] == get_auth_manager().get_url_login()


def test_the_react_bundle_is_served_behind_authentication(
    client: TestClient, token: Callable[..., str]
) -> None:
    path = "/finalckpt/static/ui/finalckpt-ui.js"
    assert client.get(path).status_code == 401
    resp = client.get(path, headers=bearer(token("VIEWER")))
    if bundle_built():  # CI and scripts/setup.sh build it: the built file itself
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("text/javascript")
        assert "Reflect.set(globalThis,t," in resp.text or "globalThis" in resp.text
    else:  # a checkout nobody built: the answer says how
        assert resp.status_code == 404 and "not built" in resp.json()["detail"]
    for bad in ("nope.js", "..%2Fstatic%2Ffinalckpt.js", "finalckpt.css"):
        assert (
            client.get(f"/finalckpt/static/ui/{bad}", headers=bearer(token("VIEWER"))).status_code
            == 404
        )
