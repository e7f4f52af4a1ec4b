"""The plugin's REST API and UI pages inside a REAL Airflow api-server (with scheduler,
dag-processor, triggerer, LocalExecutor, PostgreSQL, SimpleAuthManager users).

- the app is mounted at /finalckpt, its pages are registered as external views, every route
  needs an Airflow login;
- while the example pipeline runs: anonymous -> 401, a forged token -> 401, viewer -> 403, a
  cookie session without the CSRF header -> 403, and nothing changes; then user stops it with a
  savepoint through REST, it turns suspended (stage deferred), resumes (``finalckpt resume``
  through the api-server, as the viewer refused) and succeeds;
- the viewer's pipeline page shows no stop, resume or recompute button (the user's does);
- the stop (and the refused second stop), the resume and the restore are in Airflow's audit
  log, read back through Airflow's own ``GET /api/v2/eventLogs`` (user, DAG, run, result);
  the refused 401/403 attempts are not;
- restore through REST creates a DAG run with ``{"restore_from": path}`` in its conf.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import func, select

from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine

from .airflow_cluster import AirflowCluster
from .ui_cluster import SAVEPOINT_DAG, run_api, stage_running, store_url, ui_cluster, wait_for

CSRF = {"X-Finalckpt-Request": "1"}


@pytest.fixture(scope="module")
def cluster(airflow_cluster: Callable[..., AirflowCluster]) -> AirflowCluster:
    return ui_cluster(airflow_cluster)


def store_rows() -> tuple[Any, ...]:
    """What a stop or resume would change: stop requests, savepoints, stage lifecycles."""
    engine = make_engine(store_url())
    try:
        with engine.connect() as conn:
            stops = conn.execute(select(func.count()).select_from(t.stop_requests)).scalar()
            savepoints = conn.execute(
                select(func.count())
                .select_from(t.checkpoints)
                .where(t.checkpoints.c.kind != "checkpoint")
            ).scalar()
            return stops, savepoints
    finally:
        engine.dispose()


def test_plugin_app_and_views_are_served(cluster: AirflowCluster) -> None:
    plugins = cluster.api("GET", "/api/v2/plugins")["plugins"]
    ours = next(p for p in plugins if p["name"] == "finalckpt")
    # the pages are React apps (scripts/setup.sh built the bundle), under the routes the
    # "Pipeline" extra link and the list's links go to
    assert ours["external_views"] == []
    apps = {a["url_route"]: a for a in ours["react_apps"]}
    assert apps["finalckpt-pipeline"]["destination"] == "dag_run"
    assert apps["finalckpt-pipeline"]["bundle_url"] == "finalckpt/static/ui/finalckpt-ui.js"
    assert apps["finalckpt"]["destination"] == "nav"
    assert [a["url_prefix"] for a in ours["fastapi_apps"]] == ["/finalckpt"]

    for path in (
        "/finalckpt/api/runs",
        "/finalckpt/ui/runs",
        "/finalckpt/api/openapi.json",
        "/finalckpt/static/finalckpt.js",
        "/finalckpt/static/ui/finalckpt-ui.js",
    ):
        anonymous = cluster.request("GET", path, user=None)
        assert anonymous.status_code == 401, (path, anonymous.text)
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        assert cluster.request("GET", path, user="viewer").status_code == 200, path
    page = cluster.request("GET", "/finalckpt/ui/runs", user=None)
    assert 'href="/auth/login' in page.text
    html = cluster.request("GET", "/finalckpt/ui/runs", user="viewer")
    assert html.headers["content-type"].startswith("text/html")
    assert "<h1>Pipeline runs</h1>" in html.text
    doc = cluster.request("GET", "/finalckpt/api/openapi.json", user="viewer").json()
    assert "/api/dags/{dag_id}/runs/{run_id}/stop" in doc["paths"]


def finalckpt_cli(
    cluster: AirflowCluster, user: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """The installed console script as ``user``, through the cluster's api-server only: its
    store URL points nowhere, so a command that touched the store directly would fail."""
    env = {
        **os.environ,
        "AIRFLOW__FINALCKPT__API_URL": str(cluster.http.base_url).rstrip("/"),
        "AIRFLOW__FINALCKPT__API_USERNAME": user,
        "AIRFLOW__FINALCKPT__API_PASSWORD": cluster.users[user][1],
        "AIRFLOW__FINALCKPT__STORE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/nowhere",
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "finalckpt"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


def audit_log(cluster: AirflowCluster, event: str, dag_id: str) -> list[dict[str, Any]]:
    """The plugin's entries of Airflow's audit log through Airflow's event log API, oldest
    first, with ``extra`` parsed."""
    doc = cluster.api(
        "GET",
        "/api/v2/eventLogs",
        params={"event": event, "dag_id": dag_id, "order_by": "event_log_id", "limit": 100},
    )
    return [{**e, "extra": json.loads(e["extra"] or "{}")} for e in doc["event_logs"]]


def test_authorization_then_stop_with_savepoint_and_resume_through_rest(
    cluster: AirflowCluster,
) -> None:
    run_id = cluster.trigger_dag(SAVEPOINT_DAG)
    api = run_api(SAVEPOINT_DAG, run_id)
    wait_for(lambda: stage_running(cluster, SAVEPOINT_DAG, run_id, "enrich"), "enrich running")

    before = store_rows()
    forged = cluster.token("admin")[:-4] + "AAAA"
    attempts: list[tuple[str, dict[str, Any], int]] = [
        ("anonymous", {"user": None}, 401),
        ("forged token", {"token": forged}, 401),
        ("viewer", {"user": "viewer"}, 403),
    ]
    for who, auth, code in attempts:
        for path, body in [
            (f"{api}/stop", {"mode": "savepoint"}),
            (f"{api}/stop", {"mode": "drain"}),
            (f"{api}/resume", {}),
            (f"/finalckpt/api/dags/{SAVEPOINT_DAG}/restore", {"savepoint_path": "/x/chk-1"}),
        ]:
            resp = cluster.request("POST", path, json=body, headers=CSRF, **auth)
            assert resp.status_code == code, (who, path, resp.text)
    # the UI session cookie of a user who may edit, but no CSRF header
    cookie = cluster.http.post(
        f"{api}/stop",
        json={"mode": "savepoint"},
        headers={"Cookie": f"_token={cluster.token('user')}"},
    )
    assert cookie.status_code == 403 and "CSRF" in cookie.json()["detail"]
    assert store_rows() == before
    detail = cluster.request("GET", api, user="viewer").json()
    assert detail["summary"]["state"] == "running" and detail["summary"]["stop"] is None
    # the server-rendered pipeline page (the fallback without a React bundle) draws only
    # allowed actions (the React tab asks GET .../access: tests/e2e/test_ui_views.py)
    page = api.replace("/finalckpt/api/", "/finalckpt/ui/", 1)
    for url in (page, page + "/live"):
        viewer_page = cluster.request("GET", url, user="viewer")
        assert viewer_page.status_code == 200, viewer_page.text
        assert "data-action=" not in viewer_page.text, url
        assert "Read only" in viewer_page.text
        user_page = cluster.request("GET", url, user="user").text
        assert 'data-action="stop" data-mode="savepoint"' in user_page, url

    asked = time.monotonic()
    stop = cluster.request("POST", f"{api}/stop", json={"mode": "savepoint"}, user="user")
    assert stop.status_code == 202, stop.text
    assert stop.json()["requested_by"] == "user"
    again = cluster.request("POST", f"{api}/stop", json={"mode": "drain"}, user="user")
    assert again.status_code == 409 and "already stopping" in again.json()["detail"]

    def suspended() -> dict[str, Any] | None:
        body = cluster.request("GET", api, user="viewer").json()
        return body if body["summary"]["state"] == "suspended" else None

    detail = wait_for(suspended, "the run to turn suspended", timeout=180)
    took = time.monotonic() - asked
    print(f"\n[ui-e2e] stop with savepoint via REST: suspended after {took:.1f}s")
    assert detail["summary"]["stop"]["savepoint_path"]
    stages = {s["stage_id"]: s for s in detail["stages"]}
    assert stages["enrich"]["lifecycle"] == "SUSPENDED"
    assert stages["publish"]["lifecycle"] == "NOT_STARTED"
    wait_for(
        lambda: cluster.task_instance(SAVEPOINT_DAG, run_id, "enrich")["state"] == "deferred",
        "enrich deferred while suspended",
        timeout=120,
    )
    savepoint = detail["summary"]["stop"]["savepoint_path"]

    assert cluster.request("POST", f"{api}/resume", user="viewer").status_code == 403
    # `finalckpt resume` goes through the api-server by default: Airflow's roles decide
    denied = finalckpt_cli(cluster, "viewer", "resume", SAVEPOINT_DAG, run_id)
    assert denied.returncode == 2 and "Airflow refused to resume" in denied.stderr, denied
    resumed = finalckpt_cli(cluster, "user", "resume", SAVEPOINT_DAG, run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"] == "RESUMED"
    state = cluster.wait_for_run(SAVEPOINT_DAG, run_id, timeout=600)
    assert state == "success", cluster.log_tails(60)
    final = cluster.request("GET", api, user="viewer").json()
    assert final["summary"]["state"] == "finished"
    assert any(c["kind"] == "savepoint" for c in final["checkpoints"])

    # Airflow's audit log: the accepted stop and the refused second one, then the resume; the
    # 401/403 attempts above never reached a route and are not in it
    stops = [
        e for e in audit_log(cluster, "finalckpt.stop", SAVEPOINT_DAG) if e["run_id"] == run_id
    ]
    assert [(e["owner"], e["extra"]["mode"], e["extra"]["result"]) for e in stops] == [
        ("user", "savepoint", "accepted"),
        ("user", "drain", "refused"),
    ], stops
    assert stops[0]["extra"]["stop_request_id"] == stop.json()["request_id"]
    assert stops[1]["extra"]["status_code"] == 409
    resumes = [
        (e["owner"], e["extra"]["result"], e["extra"]["state"])
        for e in audit_log(cluster, "finalckpt.resume", SAVEPOINT_DAG)
        if e["run_id"] == run_id
    ]
    assert resumes == [("user", "accepted", "RESUMED")], resumes

    # restore the savepoint into a new DAG run (left queued: the DAG is paused)
    cluster.pause(SAVEPOINT_DAG)
    restore_path = f"/finalckpt/api/dags/{SAVEPOINT_DAG}/restore"
    denied = cluster.request(
        "POST", restore_path, json={"savepoint_path": savepoint}, user="viewer"
    )
    assert denied.status_code == 403
    created = cluster.request("POST", restore_path, json={"savepoint_path": savepoint}, user="user")
    assert created.status_code == 201, created.text
    new_run = created.json()["run_id"]
    run = cluster.api("GET", f"/api/v2/dags/{SAVEPOINT_DAG}/dagRuns/{quote(new_run, safe='')}")
    assert run["conf"] == {"restore_from": savepoint}
    assert run["triggering_user_name"] == "user"
    restores = [
        (e["owner"], e["extra"]["result"], e["extra"]["savepoint_path"])
        for e in audit_log(cluster, "finalckpt.restore", SAVEPOINT_DAG)
        if e["run_id"] == new_run
    ]
    assert restores == [("user", "accepted", savepoint)], restores
    missing = cluster.request(
        "POST",
        "/finalckpt/api/dags/no_such_dag/restore",
        json={"savepoint_path": savepoint},
        user="admin",
    )
    assert missing.status_code == 409 and "not of DAG 'no_such_dag'" in missing.json()["detail"]
