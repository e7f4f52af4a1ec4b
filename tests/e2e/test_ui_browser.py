"""Headless Chromium (Debian's /usr/bin/chromium driven by Playwright; no browser download)
against a REAL Airflow: log in through the SimpleAuthManager login form, open the pipeline tab
of a running example-pipeline DAG run, *Stop with savepoint* (confirm), see the run turn
suspended, *Resume* (confirm), see it running again and then finished. Screenshots go to the
test's tmp dir (and to ``FINALCKPT_UI_SCREENSHOTS`` if set).

Without chromium or Playwright the test fails in CI (``CI`` set) and skips elsewhere.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from .airflow_cluster import AirflowCluster
from .ui_cluster import SAVEPOINT_DAG, run_api, stage_running, ui_cluster, wait_for

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
        page.goto(f"{cluster.base_url}/auth/login")
        page.locator("input[name=username]").fill("user")
        page.locator("input[name=password]").fill(cluster.users["user"][1])
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/auth/login" not in url)
        assert any(c["name"] == "_token" for c in context.cookies())

        # 2. the pipeline tab of the DAG run (our external view, in Airflow's iframe)
        run_url = (
            f"{cluster.base_url}/dags/{SAVEPOINT_DAG}/runs/{quote(run_id, safe='')}"
            "/plugin/finalckpt-pipeline"
        )
        page.goto(run_url)
        frame = page.frame_locator("iframe[title='Pipeline']")
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
        dialog.get_by_role("button", name="Confirm").click()
        expect(header).to_have_attribute("data-run-state", "suspended", timeout=180_000)
        expect(frame.get_by_role("button", name="Resume")).to_be_enabled()
        expect(frame.get_by_role("button", name="Stop with savepoint")).to_be_disabled()
        expect(frame.locator("g.stage[data-stage-id='enrich']")).to_have_attribute(
            "data-lifecycle", "SUSPENDED"
        )
        expect(frame.locator("tr[data-kind='savepoint'][data-state='COMPLETED']")).to_have_count(1)
        expect(frame.locator("#message")).to_be_hidden()  # "waiting for the savepoint" is gone
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
        dialog.get_by_role("button", name="Confirm").click()
        expect(header).not_to_have_attribute("data-run-state", "suspended", timeout=60_000)
        state = header.get_attribute("data-run-state")
        assert state in ("running", "finished"), state
        shots(page, "resumed")
        assert cluster.wait_for_run(SAVEPOINT_DAG, run_id, timeout=600) == "success"
        expect(header).to_have_attribute("data-run-state", "finished", timeout=30_000)
        expect(frame.locator("g.stage[data-status='FULLY_FINISHED']")).to_have_count(4)
        shots(page, "finished")

        # 6. the top-level page lists the pipeline run
        page.goto(f"{cluster.base_url}/plugin/finalckpt")
        runs = page.frame_locator("iframe[title='Pipelines']")
        expect(runs.locator("table.runs")).to_contain_text(run_id)
        shots(page, "all-runs")
    finally:
        context.close()
