"""The provider's ``[finalckpt]`` table is the one source of the settings' defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from airflow_finalckpt import config
from airflow_finalckpt.config import PARSERS, FinalCkptSettings, load_settings
from airflow_finalckpt.provider_info import (
    API_CLIENT_OPTIONS,
    CONFIG_OPTIONS,
    SECTION,
    SETTING_DEFAULTS,
    expand_default,
    get_provider_info,
)
from airflow_finalckpt.store import connect


def test_every_setting_has_a_documented_option_and_a_default() -> None:
    assert set(SETTING_DEFAULTS) == set(PARSERS)
    # spark_execution (read by spark/launch/) is documented, without default: automatic; so
    # are the CLI's API client options (unset: [api] base_url, no credentials)
    unresolved = ("spark_execution", "code_signing_key", "auto_migrate", "store_password")
    unresolved = (*unresolved, "trust_forwarded_host")  # read by the plugin's CSRF check
    unresolved = (*unresolved, *API_CLIENT_OPTIONS)
    assert set(CONFIG_OPTIONS) == {*PARSERS, *unresolved}
    for name in unresolved:
        assert CONFIG_OPTIONS[name]["default"] is None, name
    for name, option in CONFIG_OPTIONS.items():
        kinds = ("string", "integer", "float", "boolean")
        assert option["description"] and option["type"] in kinds, name
        # Airflow masks sensitive options and reads their _CMD / _SECRET variants
        assert option["example"] or option.get("sensitive"), name
    assert {n for n, o in CONFIG_OPTIONS.items() if o.get("sensitive")} == {
        "api_token",
        "api_password",
        "store_url",
        "store_password",
        "code_signing_key",
    }


def test_defaults_resolve_to_the_documented_values(isolated_settings_env: Path) -> None:
    settings = load_settings()
    home = str(isolated_settings_env)
    assert settings.store_url == f"sqlite:///{home}/finalckpt/coordination.db"
    assert settings.storage_uri == f"{home}/finalckpt/checkpoints"
    assert settings.storage_options == {}
    assert set(settings.sources.values()) == {"default"}
    # the dataclass's own defaults and the connect defaults say the same
    fields = {f.name: f.default for f in dataclasses.fields(FinalCkptSettings)}
    for name in PARSERS:
        if fields[name] is not dataclasses.MISSING:
            assert getattr(settings, name) == fields[name], name
    assert settings.store_connect_retries == connect.DEFAULT_CONNECT_RETRIES
    assert settings.store_connect_backoff_s == connect.DEFAULT_CONNECT_BACKOFF_S


def test_defaults_expand_like_airflow() -> None:
    """Airflow expands a default with ``str.format`` (AIRFLOW_HOME); literal braces doubled."""
    assert expand_default(SETTING_DEFAULTS["storage_options"], "/h") == "{}"
    assert expand_default(SETTING_DEFAULTS["storage_uri"], "/h") == "/h/finalckpt/checkpoints"
    assert config._default("storage_uri").endswith("/finalckpt/checkpoints")


def test_provider_info_names_the_package_section_link_and_decorator() -> None:
    info = get_provider_info()
    assert info["package-name"] == "airflow-finalckpt"
    assert info["config"][SECTION]["options"] is CONFIG_OPTIONS
    assert info["extra-links"] == ["airflow_finalckpt.plugins.links.PipelineLink"]
    assert info["task-decorators"] == [
        {
            "name": "finalckpt_stage",
            "class-name": "airflow_finalckpt.decorators.stage.finalckpt_stage",
        }
    ]
    assert "connection-types" not in info  # the store is a postgres or sqlite connection
