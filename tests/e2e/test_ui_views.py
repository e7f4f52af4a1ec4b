"""The plugin's React views inside a REAL Airflow UI (headless Chromium, Debian's
/usr/bin/chromium driven by Playwright), on the deployment ``test_ui_browser.py`` uses (one
Airflow start for both modules):

- light and dark mode (the OS's, and Airflow's own setting): the plugin area's background in
  the screenshot follows Airflow's theme;
- the Pipelines list against 250 pipelines seeded into the store: search, state filter with its
  count, paging on the server, and a DAG run link landing in the run's Pipeline tab (Airflow's
  own page: its breadcrumb and tabs, the URL of the tab);
- a live update patches the page: the focused element, a text selection and the very DOM nodes
  survive while a value changes under them;
- a viewer sees no buttons (and is refused a forced POST), a user sees them;
- a run Airflow does not have reads "not found" and the page stops asking.

Screenshots go to the test's tmp dir (and to ``FINALCKPT_UI_SCREENSHOTS`` if set: the docs'
light and dark pictures come from there).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from tests.ui_seed import seed_pipelines

from .airflow_cluster import AirflowCluster
from .test_ui_browser import TIMEOUT_MS, browser, log_in, shots  # noqa: F401 - fixtures
from .ui_cluster import (
    DRAIN_DAG,
    SAVEPOINT_DAG,
    _environment,
    require_ui_bundle,
    run_api,
    store_url,
    ui_cluster,
)

SEEDED = 250
PREFIX = "listed"


@pytest.fixture(scope="module")
def cluster(airflow_cluster: Callable[..., AirflowCluster]) -> AirflowCluster:
    require_ui_bundle()
    return ui_cluster(airflow_cluster)


@pytest.fixture(scope="module")
def store() -> Iterator[tuple[Any, CheckpointStorage]]:
    engine = make_engine(store_url())
    storage = CheckpointStorage(str(_environment()[1] / "checkpoints"))
    yield engine, storage
    engine.dispose()


@pytest.fixture(scope="module")
def seeded(store: tuple[Any, CheckpointStorage]) -> dict[str, int]:
    """250 one-stage pipelines of the two stop DAGs, in five states (50 each)."""
    engine, storage = store
    result = seed_pipelines(engine, storage, SEEDED, (SAVEPOINT_DAG, DRAIN_DAG), PREFIX)
    return dict(result.states)


@pytest.fixture
def page_of(browser: Any) -> Iterator[Callable[..., Any]]:  # noqa: F811 - the fixture
    contexts: list[Any] = []

    def open_page(**options: Any) -> Any:
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, **options)
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


def tab_url(cluster: AirflowCluster, dag_id: str, run_id: str) -> str:
    return (
        f"{cluster.base_url}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
        "/plugin/finalckpt-pipeline"
    )


def luminance(png: bytes) -> float:
    """Relative luminance (0 black .. 1 white) of the screenshot's top-left pixel."""
    from PIL import Image

    r, g, b = Image.open(io.BytesIO(png)).convert("RGB").getpixel((2, 2))  # type: ignore[misc]
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def test_light_and_dark_mode_follow_airflow(
    cluster: AirflowCluster,
    seeded: dict[str, int],
    page_of: Callable[..., Any],
    shots: Callable[[Any, str], Path],  # noqa: F811 - the fixture
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    run_id = f"{PREFIX}__0000"  # running
    for scheme, setting in (("light", None), ("dark", None), ("light", "dark")):
        page = page_of(color_scheme=scheme)
        log_in(page, cluster)
        if setting is not None:  # Airflow's own appearance setting wins over the OS's
            page.evaluate(f"localStorage.setItem('theme', '{setting}')")
        for name, url, app in (
            ("list", f"{cluster.base_url}/plugin/finalckpt", "runs"),
            ("pipeline", tab_url(cluster, SAVEPOINT_DAG, run_id), "pipeline"),
        ):
            page.goto(url)
            area = page.locator(f"[data-finalckpt-app={app}]")
            expect(area.locator("h1")).to_be_visible()
            dark = (setting or scheme) == "dark"
            expect(page.locator("html")).to_have_class("dark" if dark else "light")
            shot = area.screenshot()
            bright = luminance(shot)
            assert (bright < 0.25) if dark else (bright > 0.85), (name, scheme, setting, bright)
            # a state in Airflow's own colour: the running badge is the theme's running token
            badge = area.locator(".badge[data-run-state=running]").first
            expect(badge).to_be_visible()
            colour = badge.evaluate("e => getComputedStyle(e, '::before').backgroundColor")
            token = page.evaluate(
                "getComputedStyle(document.documentElement)"
                ".getPropertyValue('--chakra-colors-running-solid')"
            )
            assert token.strip(), "Airflow's theme defines no running colour token"
            assert colour == badge.evaluate(
                "(e, t) => { const s = document.createElement('span'); s.style.color = t;"
                " e.append(s); const c = getComputedStyle(s).color; s.remove(); return c }",
                token.strip(),
            )
            shots(page, f"{name}-{setting or scheme}{'-setting' if setting else ''}")


def test_the_list_filters_pages_and_links_into_the_run_tab(
    cluster: AirflowCluster,
    seeded: dict[str, int],
    page_of: Callable[..., Any],
    shots: Callable[[Any, str], Path],  # noqa: F811 - the fixture
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    assert seeded["finished"] == 50
    page = page_of()
    log_in(page, cluster)
    api_calls: list[str] = []
    page.on("request", lambda r: api_calls.append(r.url) if "/finalckpt/api/runs" in r.url else 0)
    page.goto(f"{cluster.base_url}/plugin/finalckpt")
    runs = page.locator("[data-finalckpt-app=runs]")
    rows = runs.locator("table.runs tbody tr")
    showing = runs.get_by_test_id("showing")

    runs.get_by_role("searchbox").fill(PREFIX)
    expect(showing).to_have_text(f"Showing 1\u201325 of {SEEDED}")
    expect(rows).to_have_count(25)
    expect(runs.locator("[data-state-filter=finished]")).to_contain_text("50")
    runs.locator("[data-state-filter=finished]").click()
    expect(showing).to_contain_text("Showing 1\u201325 of 50")
    expect(runs.locator("table.runs tbody tr[data-run-state=finished]")).to_have_count(25)
    first_page = set(rows.evaluate_all("rs => rs.map(r => r.dataset.pipelineKey)"))
    runs.get_by_role("button", name="Next").click()
    expect(showing).to_contain_text("Showing 26\u201350 of 50")
    expect(runs.get_by_test_id("page")).to_have_text("Page 2 of 2")
    expect(runs.get_by_role("button", name="Next")).to_be_disabled()
    second_page = set(rows.evaluate_all("rs => rs.map(r => r.dataset.pipelineKey)"))
    assert len(first_page) == len(second_page) == 25 and not first_page & second_page
    # the server pages: no answer ever carried more than the page
    assert all("limit=25" in url for url in api_calls), api_calls[:3]
    shots(page, "list-filtered")

    # sort by pipeline key, ascending: the first finished one is listed.0001
    runs.locator("[data-state-filter=finished]").click()  # filter off
    runs.locator("th button[data-sort=key]").click()  # descending
    runs.locator("th button[data-sort=key]").click()  # ascending
    expect(rows.first).to_have_attribute("data-pipeline-key", f"{PREFIX}.0000")

    # a DAG run link opens the run's Pipeline tab inside Airflow (its page, not a frame)
    link = rows.first.locator("a.dag-run")
    expect(link).to_have_text(f"{SAVEPOINT_DAG} / {PREFIX}__0000")
    link.click()
    page.wait_for_url(f"**/dags/{SAVEPOINT_DAG}/runs/{PREFIX}__0000/plugin/finalckpt-pipeline")
    tab = page.locator("[data-finalckpt-app=pipeline]")
    expect(tab.locator("section.header h1")).to_contain_text(f"{PREFIX}.0000")
    assert page.locator("iframe").count() == 0
    shots(page, "list-link-landed")


def test_a_live_update_keeps_focus_selection_and_nodes(
    cluster: AirflowCluster,
    store: tuple[Any, CheckpointStorage],
    page_of: Callable[..., Any],
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    engine, storage = store
    live = Coordinator(engine, "live.one", writer=storage)
    live.register(StageGraph.build([Stage("read", ()), Stage("write", ("read",))]))
    live.link_dag_run(SAVEPOINT_DAG, "live__one")
    view = live.start_attempt("read", total_splits=4)
    page = page_of()
    log_in(page, cluster)
    page.goto(tab_url(cluster, SAVEPOINT_DAG, "live__one"))
    app = page.locator("[data-finalckpt-app=pipeline]")
    read = app.locator("g.stage[data-stage-id=read]")
    expect(read).to_have_attribute("data-progress", "0/4")

    # the user's place: focus on the "More" button, the pipeline key selected, a node marked
    more = app.get_by_role("button", name="More ▾")
    more.focus()
    page.evaluate(
        """() => {
          const key = document.querySelector('[data-finalckpt-app=pipeline] h1 span');
          const range = document.createRange(); range.selectNodeContents(key);
          const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range);
          const header = '[data-finalckpt-app=pipeline] section.header';
          document.querySelector(header).dataset.mark = 'kept';
        }"""
    )
    live.record_batch("read", view.epoch, finished_splits=["a", "b"])  # the value changes
    expect(read).to_have_attribute("data-progress", "2/4")
    assert page.evaluate("() => document.activeElement.textContent") == "More ▾"
    assert page.evaluate("() => window.getSelection().toString()") == "Pipeline live.one"
    expect(app.locator("section.header")).to_have_attribute("data-mark", "kept")


def test_a_viewer_sees_no_buttons_and_a_user_does(
    cluster: AirflowCluster,
    seeded: dict[str, int],
    page_of: Callable[..., Any],
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    run_id = f"{PREFIX}__0000"  # running
    viewer = page_of()
    log_in(viewer, cluster, user="viewer")
    viewer.goto(tab_url(cluster, SAVEPOINT_DAG, run_id))
    app = viewer.locator("[data-finalckpt-app=pipeline]")
    expect(app.locator(".read-only")).to_contain_text("Read only")
    expect(app.locator("button.action")).to_have_count(0)
    expect(app.get_by_role("button", name="More ▾")).to_have_count(0)
    forced = cluster.request(
        "POST", f"{run_api(SAVEPOINT_DAG, run_id)}/stop", user="viewer", json={"mode": "drain"}
    )
    assert forced.status_code == 403, forced.text

    user = page_of()
    log_in(user, cluster, user="user")
    user.goto(tab_url(cluster, SAVEPOINT_DAG, run_id))
    app = user.locator("[data-finalckpt-app=pipeline]")
    expect(app.get_by_role("button", name="Stop with drain")).to_be_enabled()
    expect(app.get_by_role("button", name="Resume")).to_be_disabled()
    app.get_by_role("button", name="More ▾").click()
    recompute = app.get_by_role("menuitem", name="Recompute only")
    expect(recompute).to_be_disabled()  # running: nothing may race the running stage
    expect(recompute).to_contain_text("running")
    assert app.locator(".read-only").count() == 0


def test_a_missing_run_reads_not_found_and_the_page_stops_asking(
    cluster: AirflowCluster,
    page_of: Callable[..., Any],
    shots: Callable[[Any, str], Path],  # noqa: F811 - the fixture
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    page = page_of()
    log_in(page, cluster)
    asked: list[float] = []
    page.on(
        "request",
        lambda r: asked.append(time.monotonic()) if r.url.endswith("/runs/no_such_run") else 0,
    )
    page.goto(tab_url(cluster, SAVEPOINT_DAG, "no_such_run"))
    alert = page.locator("[data-finalckpt-app=pipeline] [role=alert]")
    expect(alert).to_contain_text(f"DAG run 'no_such_run' of DAG '{SAVEPOINT_DAG}' not found")
    expect(alert).to_have_attribute("data-reason", "run")
    assert "not started" not in alert.inner_text()
    page.wait_for_timeout(6000)  # three polling periods
    assert len(asked) == 1, f"the page asked {len(asked)} times for a run that does not exist"
    shots(page, "not-found")
