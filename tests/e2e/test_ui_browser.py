"""Headless Chromium (Debian's /usr/bin/chromium driven by Playwright; no browser download)
against a REAL Airflow, clicking every button of the pipeline page:

- log in through the SimpleAuthManager login form, open the pipeline tab (our React app,
  rendered by Airflow's UI: ``react_apps``) of a running example-pipeline DAG run, *Stop with
  savepoint* (confirm), see the run turn suspended with its savepoint path, *Resume* (cancel,
  then confirm), see it running again (the path kept) and then finished;
- on another run, *Stop with drain* (cancel: no stop request is stored; then confirm): the stop
  request row is a drain by the user, ingest stops reading with days left unread, every stage
  finishes, the drained savepoint completes, the DAG run succeeds with its "Drained" note, every
  button is disabled and a resume is refused.

The Pipelines list, light and dark mode, live updates, permissions and a missing run are in
``test_ui_views.py`` (the same Airflow deployment). Screenshots go to the test's tmp dir (and
to ``FINALCKPT_UI_SCREENSHOTS`` if set).

Without chromium or Playwright the test fails in CI (``CI`` set) and skips elsewhere.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import select

from airflow_finalckpt.store import schema as t
from airflow_finalckpt.store.engine import make_engine

from .airflow_cluster import AirflowCluster
from .ui_cluster import (
    DAYS,
    SAVEPOINT_DAG,
    UI_DRAIN_DAG,
    require_ui_bundle,
    run_api,
    stage_running,
    store_url,
    ui_cluster,
    wait_for,
)

CHROMIUM = os.environ.get("FINALCKPT_CHROMIUM", "/usr/bin/chromium")
TIMEOUT_MS = 60_000


def _unavailable(why: str) -> None:
    message = (
        f"{why}; install it with scripts/setup.sh (as root: apt-get install chromium) "
        "and `pip install -e .[dev]`"
    )
    if os.environ.get("CI"):
        pytest.fail(f"browser test cannot run in CI: {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        _unavailable(f"no chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright for Python is not installed")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def cluster(airflow_cluster: Callable[..., AirflowCluster]) -> AirflowCluster:
    require_ui_bundle()
    return ui_cluster(airflow_cluster)


@pytest.fixture
def shots(tmp_path: Path) -> Iterator[Callable[[Any, str], Path]]:
    folder = tmp_path / "screenshots"
    folder.mkdir()
    taken: list[Path] = []

    def shoot(page: Any, name: str) -> Path:
        path = folder / f"{len(taken) + 1:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        taken.append(path)
        return path

    yield shoot
    print(f"\n[ui-e2e] screenshots: {folder}")
    keep = os.environ.get("FINALCKPT_UI_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for path in taken:
            shutil.copy(path, Path(keep) / path.name)


def log_in(page: Any, cluster: AirflowCluster, user: str = "user") -> None:
    """Through Airflow's own login form, as the user who may edit runs unless told."""
    page.goto(f"{cluster.base_url}/auth/login")
    page.locator("input[name=username]").fill(user)
    page.locator("input[name=password]").fill(cluster.users[user][1])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)
    assert any(c["name"] == "_token" for c in page.context.cookies())


def pipeline_tab(page: Any, cluster: AirflowCluster, dag_id: str, run_id: str) -> Any:
    """The DAG run's Pipeline tab: our React app, rendered by Airflow's UI itself (no iframe)."""
    page.goto(
        f"{cluster.base_url}/dags/{dag_id}/runs/{quote(run_id, safe='')}/plugin/finalckpt-pipeline"
    )
    return page.locator("[data-finalckpt-app=pipeline]")


def stop_requests(dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """The stop request rows of a DAG run's pipeline, read from the coordination store."""
    engine = make_engine(store_url())
    try:
        with engine.connect() as conn:
            key = conn.execute(
                select(t.dag_runs.c.pipeline_key).where(
                    t.dag_runs.c.dag_id == dag_id, t.dag_runs.c.run_id == run_id
                )
            ).scalar_one()
            rows = conn.execute(
                select(t.stop_requests).where(t.stop_requests.c.pipeline_key == key)
            )
            return [dict(row._mapping) for row in rows]
    finally:
        engine.dispose()


def test_stop_with_savepoint_and_resume_from_the_airflow_ui(
    cluster: AirflowCluster, browser: Any, shots: Callable[[Any, str], Path]
) -> None:
    from playwright.sync_api import expect

    # expect() has its own 5 s default, separate from the context's; the first paint of
    # Airflow's iframe takes longer than that on a loaded 2-core CI machine
    expect.set_options(timeout=TIMEOUT_MS)
    run_id = cluster.trigger_dag(SAVEPOINT_DAG)
    wait_for(lambda: stage_running(cluster, SAVEPOINT_DAG, run_id, "enrich"), "enrich running")

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        # 1. log in through Airflow's own login form
        log_in(page, cluster)

        # 2. the pipeline tab of the DAG run (our React app inside Airflow's page)
        frame = pipeline_tab(page, cluster, SAVEPOINT_DAG, run_id)
        header = frame.locator("section.header")
        expect(header).to_have_attribute("data-run-state", "running")
        expect(frame.locator("svg.stage-graph g.stage")).to_have_count(4)
        expect(frame.locator("g.stage[data-stage-id='enrich']")).to_have_attribute(
            "data-lifecycle", "RUNNING"
        )
        expect(frame.locator("table.checkpoints tbody tr").first).to_be_visible()
        shots(page, "running")

        # 3. Stop with savepoint -> confirmation dialog -> confirm
        frame.get_by_role("button", name="Stop with savepoint").click()
        dialog = frame.locator("dialog#confirm")
        expect(dialog).to_be_visible()
        expect(dialog).to_contain_text("savepoint")
        shots(page, "confirm-stop")
        dialog.get_by_role("button", name="Stop with savepoint").click()
        expect(header).to_have_attribute("data-run-state", "suspended", timeout=180_000)
        expect(frame.get_by_role("button", name="Resume")).to_be_enabled()
        expect(frame.get_by_role("button", name="Stop with savepoint")).to_be_disabled()
        expect(frame.locator("g.stage[data-stage-id='enrich']")).to_have_attribute(
            "data-lifecycle", "SUSPENDED"
        )
        expect(frame.locator("tr[data-kind='savepoint'][data-state='COMPLETED']")).to_have_count(1)
        expect(frame.locator("#message")).to_be_hidden()  # "waiting for the savepoint" is gone
        # the savepoint's path is shown and stays after the resume (a restore needs it)
        savepoint_path = frame.locator("dl.stop code.savepoint-path")
        expect(savepoint_path).to_contain_text("chk-")
        shots(page, "suspended")
        api = cluster.request("GET", run_api(SAVEPOINT_DAG, run_id), user="viewer").json()
        assert api["summary"]["state"] == "suspended"
        assert api["summary"]["stop"]["requested_by"] == "user"

        # 4. a cancelled confirmation does nothing
        frame.get_by_role("button", name="Resume").click()
        dialog.get_by_role("button", name="Cancel").click()
        page.wait_for_timeout(2500)
        expect(header).to_have_attribute("data-run-state", "suspended")

        # 5. Resume -> confirm -> running, then finished
        frame.get_by_role("button", name="Resume").click()
        expect(dialog).to_be_visible()
        dialog.get_by_role("button", name="Resume").click()
        expect(header).not_to_have_attribute("data-run-state", "suspended", timeout=60_000)
        state = header.get_attribute("data-run-state")
        assert state in ("running", "finished"), state
        expect(savepoint_path).to_contain_text("chk-")
        expect(frame.locator("dl.stop")).to_contain_text("resumed by user")
        shots(page, "resumed")
        assert cluster.wait_for_run(SAVEPOINT_DAG, run_id, timeout=600) == "success"
        expect(header).to_have_attribute("data-run-state", "finished", timeout=30_000)
        expect(frame.locator("g.stage[data-status='FULLY_FINISHED']")).to_have_count(4)
        shots(page, "finished")

        # 6. the top-level page lists the pipeline run, finished, in Airflow's success colour
        page.goto(f"{cluster.base_url}/plugin/finalckpt")
        runs = page.locator("[data-finalckpt-app=runs]")
        row = runs.locator(f"table.runs tr:has(a.dag-run:text-is('{SAVEPOINT_DAG} / {run_id}'))")
        expect(row).to_have_attribute("data-run-state", "finished")
        expect(row.locator(".badge")).to_have_attribute("data-palette", "success")
        shots(page, "all-runs")
    finally:
        context.close()


def test_stop_with_drain_from_the_airflow_ui(
    cluster: AirflowCluster, browser: Any, shots: Callable[[Any, str], Path]
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        log_in(page, cluster)
        run_id = cluster.trigger_dag(UI_DRAIN_DAG)
        frame = pipeline_tab(page, cluster, UI_DRAIN_DAG, run_id)  # polls until registered
        header = frame.locator("section.header")
        expect(header).to_have_attribute("data-run-state", "running")
        drain = frame.get_by_role("button", name="Stop with drain")
        dialog = frame.locator("dialog#confirm")

        # 1. Stop with drain -> the dialog explains it -> Cancel: nothing is stored
        drain.click()
        expect(dialog).to_be_visible()
        expect(dialog).to_contain_text("cannot be resumed")
        shots(page, "confirm-drain")
        dialog.get_by_role("button", name="Cancel").click()
        expect(dialog).to_be_hidden()
        page.wait_for_timeout(2500)
        expect(header).to_have_attribute("data-run-state", "running")
        assert stop_requests(UI_DRAIN_DAG, run_id) == []

        # ingest's first batch (7 of 21 days) is done (Spark's start-up on a loaded machine can
        # take minutes); its second waits for the drain request (stop_dags/stop_pipelines.py)
        expect(frame.locator("g.stage[data-stage-id='ingest']")).to_have_attribute(
            "data-progress", re.compile(r"^[1-9][0-9]*/"), timeout=300_000
        )
        # 2. Stop with drain -> Confirm: a drain request by the user is stored, no more buttons
        drain.click()
        expect(dialog).to_be_visible()
        dialog.get_by_role("button", name="Stop with drain").click()
        expect(header).to_have_attribute("data-run-state", re.compile("^(draining|drained)$"))
        for name in ("Stop with drain", "Stop with savepoint", "Resume"):
            expect(frame.get_by_role("button", name=name)).to_be_disabled()
        [stop] = stop_requests(UI_DRAIN_DAG, run_id)
        assert (stop["mode"], stop["requested_by"]) == ("drain", "user"), stop
        shots(page, "draining")

        # 3. the drain's effects: ingest stopped reading, every stage finished and committed
        assert cluster.wait_for_run(UI_DRAIN_DAG, run_id, timeout=600) == "success", (
            cluster.log_tails(80)
        )
        expect(header).to_have_attribute("data-run-state", "drained", timeout=30_000)
        expect(frame.locator("g.stage[data-status='FULLY_FINISHED']")).to_have_count(4)
        expect(
            frame.locator("tr[data-kind='drained_savepoint'][data-state='COMPLETED']")
        ).to_have_count(1)
        expect(header).to_contain_text("unread input")
        # a drain that left input unread does not look like a finished run
        expect(header.locator(".badge")).to_have_attribute("data-palette", "amber")
        expect(header.locator(".badge")).to_contain_text("unread")
        for name in ("Stop with drain", "Stop with savepoint", "Resume"):
            expect(frame.get_by_role("button", name=name)).to_be_disabled()
        shots(page, "drained")
        [stop] = stop_requests(UI_DRAIN_DAG, run_id)
        assert stop["state"] == "COMPLETED" and stop["savepoint_id"] is not None, stop
        api = cluster.request("GET", run_api(UI_DRAIN_DAG, run_id), user="viewer").json()
        assert 0 < api["summary"]["unread_splits"] < DAYS, api["summary"]
        ingest = cluster.xcom(UI_DRAIN_DAG, run_id, "ingest", key="end_of_data")
        assert ingest["drain"] is True and ingest["unread_splits"] > 0
        note = cluster.dag_run(UI_DRAIN_DAG, run_id).get("note") or ""
        assert "Drained" in note, note
        resume = cluster.request("POST", f"{run_api(UI_DRAIN_DAG, run_id)}/resume", user="user")
        assert resume.status_code == 409 and "cannot be resumed" in resume.json()["detail"]
    finally:
        context.close()
