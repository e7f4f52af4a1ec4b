"""One Airflow cluster configuration shared by the stop/resume end-to-end tests
(``test_stop_api.py``, ``test_stop_resume.py``, ``test_ui_browser.py``): the stop/resume
example DAGs, a coordination store in its own PostgreSQL database and a work directory, created
once per pytest process so that all modules get the same ``airflow_cluster(...)`` arguments and
share one deployment."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

from .airflow_cluster import AirflowCluster, _create_database, _drop_database, postgres_reachable

STOP_DAGS = Path(__file__).parent / "stop_dags"
# Paced by order (stop_dags/stop_pipelines.py): the stopped stage's second batch waits for the
# stop request (savepoint, resume, ui_drain) or for a gate file the test writes (drain).
SAVEPOINT_DAG = "finalckpt_e2e_savepoint"  # enrich's second batch waits for the stop request
RESUME_DAG = "finalckpt_e2e_resume"  # the same, its own sinks (test_stop_resume.py)
DRAIN_DAG = "finalckpt_e2e_drain"  # ingest's second batch waits for the test's gate file
UI_DRAIN_DAG = "finalckpt_e2e_ui_drain"  # ingest's second batch waits for the drain request
DAYS = 21  # three ingest batches of 7 days; enrich runs three batches of one part


@functools.cache
def _environment() -> tuple[dict[str, str], Path, str]:
    work = Path(tempfile.mkdtemp(prefix="finalckpt-ui-e2e-"))
    name = f"finalckpt_ui_{uuid.uuid4().hex[:10]}"
    url = _create_database(name)
    engine = make_engine(url)
    ensure_schema(engine)
    engine.dispose()
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    atexit.register(_drop_database, name)
    env = {
        "AIRFLOW__FINALCKPT__STORE_URL": url,
        "AIRFLOW__FINALCKPT__STORAGE_URI": str(work / "checkpoints"),
        "FINALCKPT_E2E_WORK": str(work),
        "FINALCKPT_E2E_DAYS": str(DAYS),
    }
    return env, work, url


def require_ui_bundle() -> None:
    """The browser tests drive the React pages: without the bundle the plugin registers the
    fallback iframe pages instead, and every check would fail for that reason alone."""
    from airflow_finalckpt.plugins.finalckpt_plugin import bundle_built

    if not bundle_built():
        pytest.fail(
            "the plugin's UI bundle is not built (airflow_finalckpt/plugins/api/static/ui/): "
            "run scripts/build_ui.sh (scripts/setup.sh does)",
            pytrace=False,
        )


def ui_cluster(airflow_cluster: Callable[..., AirflowCluster]) -> AirflowCluster:
    ok, why = postgres_reachable()
    if not ok:
        if os.environ.get("FINALCKPT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{why} but FINALCKPT_REQUIRE_POSTGRES=1", pytrace=False)
        pytest.skip(why)
    env, _work, _url = _environment()
    return airflow_cluster(
        [STOP_DAGS], extra_env=env, expect_dags=[SAVEPOINT_DAG, RESUME_DAG, DRAIN_DAG, UI_DRAIN_DAG]
    )


def store_url() -> str:
    return _environment()[2]


def run_api(dag_id: str, run_id: str) -> str:
    return f"/finalckpt/api/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def wait_for(check: Callable[[], Any], what: str, timeout: float = 300, every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(every)


def stage_running(cluster: AirflowCluster, dag_id: str, run_id: str, stage_id: str) -> bool:
    """The pipeline page's data says ``stage_id`` is running with at least one split done."""
    resp = cluster.request("GET", run_api(dag_id, run_id), user="admin")
    if resp.status_code != 200:
        return False
    stage = {s["stage_id"]: s for s in resp.json()["stages"]}.get(stage_id)
    return bool(stage and stage["lifecycle"] == "RUNNING" and stage["done_splits"] >= 1)
