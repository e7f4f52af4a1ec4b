"""The plugin loads through the ``airflow.plugins`` entry point, in Airflow's own loaders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt.plugins.finalckpt_plugin import (
    FinalCheckpointPlugin,
    bundle_built,
    ui_views,
)

pytestmark = pytest.mark.usefixtures("airflow_home")

ENTRY_POINT = "airflow_finalckpt.plugins.finalckpt_plugin:FinalCheckpointPlugin"


def ours_failed(import_errors: dict[str, str]) -> dict[str, str]:
    """Import errors of our plugin. A stale ``airflow_finalckpt.egg-info`` beside the sources
    (on sys.path when Python runs from the checkout) makes importlib.metadata see the package
    twice; Airflow then skips the second copy as "already registered": not a load failure."""
    return {
        k: v for k, v in import_errors.items() if "finalckpt" in k and "already registered" not in v
    }


def test_entry_point_is_installed() -> None:
    from importlib.metadata import entry_points

    points = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "finalckpt"]

    assert [ep.value for ep in points] == [ENTRY_POINT], (
        "the package is not installed (pip install -e .) or its entry point changed"
    )
    assert points[0].load() is FinalCheckpointPlugin


def test_core_plugins_manager_loads_it_without_errors() -> None:
    from airflow import plugins_manager

    plugins, import_errors = plugins_manager._get_plugins()

    ours = [p for p in plugins if p.name == "finalckpt"]
    assert len(ours) == 1
    assert isinstance(ours[0], FinalCheckpointPlugin)
    assert ENTRY_POINT in str(ours[0].source)
    assert not ours_failed(import_errors), import_errors
    info = [i for i in plugins_manager.get_plugin_info() if i["name"] == "finalckpt"]
    assert len(info) == 1


def test_task_sdk_plugins_manager_loads_it() -> None:
    """Workers load plugins through the Task SDK's own manager (another AirflowPlugin class)."""
    from airflow.sdk import plugins_manager

    plugins, import_errors = plugins_manager._get_plugins()

    assert [p.name for p in plugins if p.name == "finalckpt"] == ["finalckpt"]
    assert not ours_failed(import_errors), import_errors


def test_plugin_registers_the_app_views_and_link_only() -> None:
    """The REST/UI app at /finalckpt, the pipeline tab of a DAG run, a top-level page and the
    "Pipeline" extra link; nothing else (a dangling registration breaks the API server)."""
    plugin = FinalCheckpointPlugin()
    for attr in (
        "fastapi_root_middlewares",
        "global_operator_extra_links",
        "macros",
        "timetables",
    ):
        assert getattr(FinalCheckpointPlugin, attr) == [], attr
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == "/finalckpt" and app["app"] is plugin.fastapi_apps[0]["app"]
    # the checkout's bundle decides: React apps when built, else the iframe pages
    expected = ui_views(bundle_built())
    assert (plugin.external_views, plugin.react_apps) == expected
    assert [link.name for link in plugin.operator_extra_links] == ["Pipeline"]


def test_the_pages_are_react_apps_with_a_bundle_and_iframes_without() -> None:
    """Both registrations keep the url_routes the extra link and the list's links go to."""
    iframes, none = ui_views(react=False)
    assert none == []
    views = {v["destination"]: v for v in iframes}
    assert views["dag_run"]["href"] == "/finalckpt/ui/dags/{DAG_ID}/runs/{RUN_ID}"
    assert views["dag_run"]["url_route"] == "finalckpt-pipeline"
    assert views["nav"]["href"] == "/finalckpt/ui/runs" and views["nav"]["nav_top_level"]
    none, react = ui_views(react=True)
    assert none == []
    apps = {a["destination"]: a for a in react}
    assert {a["bundle_url"] for a in react} == {"finalckpt/static/ui/finalckpt-ui.js"}
    assert (apps["dag_run"]["name"], apps["dag_run"]["url_route"]) == (
        "Pipeline",
        "finalckpt-pipeline",
    )
    assert (apps["nav"]["name"], apps["nav"]["url_route"]) == ("Pipelines", "finalckpt")
    assert apps["nav"]["nav_top_level"]


def test_plugin_module_import_stays_cheap() -> None:
    """Every Airflow component imports the plugin: no FastAPI app, store or Spark at import."""
    code = (
        "import sys, airflow_finalckpt.plugins.finalckpt_plugin as m\n"
        "heavy = [n for n in ('fastapi', 'pyspark', 'airflow_finalckpt.plugins.api',\n"
        "    'airflow_finalckpt.operators.stage', 'airflow_finalckpt.store.engine')\n"
        "    if n in sys.modules]\n"
        "print('heavy modules:', heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    # Airflow logs to stdout too (see plugins_listed): find our line, wherever it is
    lines = [line for line in proc.stdout.splitlines() if line.startswith("heavy modules:")]
    assert lines == ["heavy modules: []"], proc.stdout + proc.stderr


def test_airflow_serves_the_plugin_views_and_app() -> None:
    """What Airflow's UI receives from GET /api/v2/plugins, and what the api-server mounts."""
    from airflow import plugins_manager

    external_views, react_apps = plugins_manager._get_ui_plugins()
    ours = [
        v
        for v in [*external_views, *react_apps]
        if "finalckpt/" in v.get("href", "") + v.get("bundle_url", "")
    ]
    assert {v["url_route"] for v in ours} == {"finalckpt", "finalckpt-pipeline"}
    apps, _ = plugins_manager.get_fastapi_plugins()
    assert [a["url_prefix"] for a in apps if a["name"] == "airflow-finalckpt"] == ["/finalckpt"]
    info = [i for i in plugins_manager.get_plugin_info() if i["name"] == "finalckpt"]
    assert info[0]["operator_extra_links"]


def test_airflow_plugins_cli_lists_it(airflow_home: Any, tmp_path: Path) -> None:
    """A fresh process, the way every Airflow component starts: ``airflow`` is imported first,
    then the entry point (eagerly here, as with ``[core] lazy_load_plugins = False``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["AIRFLOW__CORE__LAZY_LOAD_PLUGINS"] = "False"
    airflow = Path(sys.executable).with_name("airflow")

    proc = subprocess.run(
        [str(airflow), "plugins", "--output", "json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )

    output = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, output
    ours = [p for p in plugins_listed(proc.stdout) if p["name"] == "finalckpt"]
    assert len(ours) == 1, output
    assert ENTRY_POINT in ours[0]["source"]
    assert "Failed to import plugin" not in proc.stdout + proc.stderr


def plugins_listed(stdout: str) -> list[dict[str, Any]]:
    """The list ``airflow plugins --output json`` prints. Airflow 3's CLI writes its own log
    lines to stdout too, in structlog's console format (``<time> [warning  ] <message>
    [<logger>]``), before and after the listing, which AirflowConsole prints on one line (soft
    wrap): the listing is the line that is a JSON array, not whatever follows the first "[".
    """
    for line in stdout.splitlines():
        if not line.startswith("["):
            continue
        try:
            document = json.loads(line)
        except ValueError:
            continue
        if isinstance(document, list):
            return document
    raise AssertionError(f"no JSON list in the output of `airflow plugins`:\n{stdout[-3000:]}")


#: What `airflow plugins --output json` printed with a deprecated option set (shortened): a log
#: line of Airflow's own before the listing, and one after it.
_LOGGED_THEN_LISTED = (
    "2026-11-24T22:48:42.502967Z [warning  ] The secret_key option in [webserver] has been moved "
    "to the secret_key option in [api] [py.warnings] category=DeprecationWarning\n"
    '[{"name": "finalckpt", "listeners": ["airflow_finalckpt.listeners.dag_run_notes"], '
    '"source": "airflow-finalckpt==0.1.0: EntryPoint(name=\'finalckpt\')"}]\n'
    "2026-11-24T22:48:49.100000Z [info     ] shutting down [airflow.settings]\n"
)


def test_plugins_listing_is_found_between_airflow_log_lines() -> None:
    """The cause of this module's flaky CLI test: any warning Airflow logged to stdout before the
    listing (it takes the first "[" of stdout, here the log level's) broke the old parse."""
    with pytest.raises(json.JSONDecodeError):
        json.loads(_LOGGED_THEN_LISTED[_LOGGED_THEN_LISTED.index("[") :])
    listed = plugins_listed(_LOGGED_THEN_LISTED)
    assert [p["name"] for p in listed] == ["finalckpt"]
    assert listed[0]["listeners"] == ["airflow_finalckpt.listeners.dag_run_notes"]
    with pytest.raises(AssertionError, match=r"(?s)no JSON list.*\[warning  \]"):
        plugins_listed(_LOGGED_THEN_LISTED.splitlines()[0])
