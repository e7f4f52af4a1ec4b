"""Airflow discovers airflow-finalckpt as a provider (``apache_airflow_provider`` entry point):
its ``[finalckpt]`` defaults come through Airflow's config, ``@task.finalckpt_stage`` and the
"Pipeline" link are registered, and Airflow's own CLI shows all of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points, version
from pathlib import Path
from typing import Any

import pytest

from airflow_finalckpt import config
from airflow_finalckpt.provider_info import (
    CONFIG_OPTIONS,
    SECTION,
    SETTING_DEFAULTS,
    expand_default,
    get_provider_info,
)

pytestmark = pytest.mark.usefixtures("airflow_home")

ENTRY_POINT = "airflow_finalckpt.provider_info:get_provider_info"


@pytest.fixture
def airflow_conf(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Airflow's ``conf``, the real ``_read_airflow_cfg`` and no finalckpt env."""
    from airflow.configuration import conf

    for name in list(os.environ):
        if name.startswith("AIRFLOW__FINALCKPT__") or name == config.CONNECTION_ENV:
            monkeypatch.delenv(name)
    yield conf


def _airflow_default(name: str) -> str:
    from airflow.configuration import AIRFLOW_HOME

    return expand_default(SETTING_DEFAULTS[name], AIRFLOW_HOME)


def test_entry_point_is_installed() -> None:
    points = [ep.value for ep in entry_points(group="apache_airflow_provider")]
    assert ENTRY_POINT in points, "not installed (pip install -e .) or the entry point changed"


def test_provider_info_matches_airflows_schema() -> None:
    from airflow.providers_manager import _create_provider_info_schema_validator

    _create_provider_info_schema_validator().validate(get_provider_info())


def test_providers_manager_discovers_it() -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    provider = manager.providers["airflow-finalckpt"]
    assert provider.version == version("airflow-finalckpt")
    assert provider.data["versions"] == [provider.version]
    assert "airflow_finalckpt.plugins.links.PipelineLink" in manager.extra_links_class_names
    configs = dict(manager.provider_configs)
    assert configs["airflow-finalckpt"][SECTION]["options"].keys() == CONFIG_OPTIONS.keys()


def test_task_decorator_is_task_dot_finalckpt_stage() -> None:
    from airflow.sdk import task

    from airflow_finalckpt.decorators import finalckpt_stage

    assert task.finalckpt_stage is finalckpt_stage


def test_defaults_come_through_airflows_config(airflow_conf: Any) -> None:
    for name in SETTING_DEFAULTS:
        assert airflow_conf.get(SECTION, name) == _airflow_default(name), name
    assert airflow_conf.get(SECTION, "spark_execution", fallback=None) is None
    assert airflow_conf.getint(SECTION, "retain_checkpoints") == 3
    assert airflow_conf.getfloat(SECTION, "store_connect_backoff_s") == 1.0
    # the settings resolve to the same values, labelled as defaults (nothing was configured)
    settings = config.load_settings()
    assert set(settings.sources.values()) == {"default"}, settings.sources
    assert settings.store_url == _airflow_default("store_url")
    assert settings.storage_uri == _airflow_default("storage_uri")
    assert settings.storage_options == {}


def test_a_configured_value_is_read_through_airflows_config(airflow_conf: Any) -> None:
    airflow_conf.set(SECTION, "retain_checkpoints", "7")
    try:
        assert config.resolve_setting("retain_checkpoints") == (
            7,
            "airflow.cfg [finalckpt] retain_checkpoints",
        )
        # env still wins over Airflow's config, as before
        os.environ["AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS"] = "9"
        try:
            assert config.resolve_setting("retain_checkpoints")[0] == 9
        finally:
            del os.environ["AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS"]
    finally:
        airflow_conf.remove_option(SECTION, "retain_checkpoints", remove_default=False)
    assert config.resolve_setting("retain_checkpoints") == (3, "default")


def _airflow_cli(*args: str, cwd: Path) -> str:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "AIRFLOW__FINALCKPT"))
    }
    airflow = Path(sys.executable).with_name("airflow")
    proc = subprocess.run(
        [str(airflow), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_airflow_cli_lists_the_provider_and_its_config(tmp_path: Path) -> None:
    """What an operator sees: ``airflow providers get`` and ``airflow config list``."""
    out = _airflow_cli("providers", "get", "airflow-finalckpt", "--output", "json", cwd=tmp_path)
    listed = json.loads(out[out.index("[") :])
    assert listed == [{"Provider": "airflow-finalckpt", "Version": version("airflow-finalckpt")}]

    args = ("config", "list", "--section", SECTION, "--show-values", "--color", "off")
    out = _airflow_cli(*args, cwd=tmp_path)
    assert f"[{SECTION}]" in out
    for name in SETTING_DEFAULTS:
        assert f"\n{name} = {_airflow_default(name)}\n" in out, (name, out)
    assert "\n# spark_execution = \n" in out  # documented, no default: automatic


def test_a_plugins_folder_shim_would_register_the_plugin_twice(tmp_path: Path) -> None:
    """Why the repository has no ``plugins/`` shim for ``$AIRFLOW_HOME/plugins`` (README,
    "Installing into Airflow"): with the package installed, Airflow already loads the plugin
    from its entry point, and a shim makes Airflow record a plugin import error."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "finalckpt_shim.py").write_text(
        "from airflow_finalckpt.plugins.finalckpt_plugin import FinalCheckpointPlugin\n"
    )
    code = (
        "import json\n"
        "from airflow import plugins_manager\n"
        "plugins, errors = plugins_manager._get_plugins()\n"
        "print(json.dumps([[p.name for p in plugins], list(errors.values())]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(plugins)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    names, errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert names.count("finalckpt") == 1
    assert "Plugin 'finalckpt' already registered, skipping" in errors
