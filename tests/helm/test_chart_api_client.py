"""The chart wires the ``finalckpt`` CLI to Airflow's REST API (``finalckpt restore``): the URL of
the official chart's api-server Service in the ConfigMap, the Airflow login only as env from an
existing Secret (the official chart's ``secret`` values), never as a value; and the CLI's own
settings reader (cli/airflow_api.py) finds both where the chart puts them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from chart_helpers import NAMESPACE, RELEASE, REPO, Rendered, container_env, pod_spec
from test_chart_render import SCENARIOS

Render = Callable[..., Rendered]

LOGIN_SECRET = "finalckpt-airflow-api"
API_ENV = {
    "url": "AIRFLOW__FINALCKPT__API_URL",
    "token": "AIRFLOW__FINALCKPT__API_TOKEN",
    "username": "AIRFLOW__FINALCKPT__API_USERNAME",
    "password": "AIRFLOW__FINALCKPT__API_PASSWORD",
}
CREDENTIAL_ENV = {API_ENV["token"], API_ENV["username"], API_ENV["password"]}


def secret_env(rendered: Rendered) -> dict[str, tuple[str, str]]:
    """envName -> (Secret, key) of the official chart's ``secret`` values printed by NOTES."""
    return {
        s["envName"]: (s["secretName"], s["secretKey"])
        for s in rendered.official_values()["secret"]
    }


@pytest.fixture
def clean_api_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No API client setting from the caller's environment (only what a test sets)."""
    for name in (*API_ENV.values(), "AIRFLOW__API__BASE_URL"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(f"{name}_CMD", raising=False)
        monkeypatch.delenv(f"{name}_SECRET", raising=False)
    yield monkeypatch


# --------------------------------------------------------------------------- where


def test_api_url_is_the_official_api_server_service_in_the_cluster(render: Render) -> None:
    assert render().config()[API_ENV["url"]] == "http://airflow-api-server.airflow.svc:8080"
    other = render({"airflow": {"releaseName": "prod-airflow"}}, namespace="data")
    assert (
        other.one("ConfigMap", f"{RELEASE}-config")["data"][API_ENV["url"]]
        == "http://prod-airflow-api-server.data.svc:8080"
    )
    assert "at http://prod-airflow-api-server.data.svc:8080" in other.notes


def test_api_url_option_wins_without_its_trailing_slash(render: Render) -> None:
    rendered = render(SCENARIOS["api-token-secret"])
    assert rendered.config()[API_ENV["url"]] == "https://airflow-internal.example.com:8443"
    # the public URL (NOTES' links) is another option and does not move the CLI
    public = render({"airflow": {"apiServerUrl": "https://airflow.example.com"}})
    assert public.config()[API_ENV["url"]] == "http://airflow-api-server.airflow.svc:8080"


# --------------------------------------------------------------------------- who


def test_without_a_secret_no_login_is_rendered_and_notes_say_how(render: Render) -> None:
    rendered = render()
    assert not CREDENTIAL_ENV & set(secret_env(rendered))
    assert not CREDENTIAL_ENV & set(rendered.config())
    notes = rendered.notes
    assert "no login configured (airflow.api.existingSecret)" in notes
    assert "the api-server refuses it (401)" in notes
    assert f"kubectl -n {NAMESPACE} create secret generic {LOGIN_SECRET}" in notes
    assert f"--set airflow.api.existingSecret={LOGIN_SECRET}" in notes
    # the REST restore through the port-forward, never the in-cluster DNS name
    assert "http://localhost:8080/finalckpt/api/dags/DAG_ID/restore" in notes


def test_login_comes_from_the_existing_secret_as_secret_env(render: Render) -> None:
    rendered = render(SCENARIOS["api-login-secret"])
    env = secret_env(rendered)
    assert env[API_ENV["username"]] == (LOGIN_SECRET, "username")
    assert env[API_ENV["password"]] == (LOGIN_SECRET, "pw")
    assert API_ENV["token"] not in env
    # referenced, not created, and nowhere as a value
    assert not rendered.has("Secret", LOGIN_SECRET)
    assert not CREDENTIAL_ENV & set(rendered.config())
    assert f"login from Secret {LOGIN_SECRET} (keys username, pw)" in rendered.notes
    assert "finalckpt restore DAG_ID --from SAVEPOINT_PATH --dry-run" in rendered.notes
    assert "refuses it (401)" not in rendered.notes


def test_token_key_replaces_the_username_and_password(render: Render) -> None:
    rendered = render(SCENARIOS["api-token-secret"])
    env = secret_env(rendered)
    assert {k: v for k, v in env.items() if k in CREDENTIAL_ENV} == {
        API_ENV["token"]: (LOGIN_SECRET, "jwt")
    }
    assert f"token from Secret {LOGIN_SECRET} (key jwt)" in rendered.notes


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_no_login_in_any_configmap_nor_in_the_jobs(render: Render, scenario: str) -> None:
    """Credentials reach the Airflow pods only through secretKeyRef env; this chart's jobs
    (migration, GC) never call Airflow's API and do not get them, except the GC CronJob with
    gc.checkDagRuns (it asks which DAG runs exist), and then only as secretKeyRef env."""
    values = SCENARIOS[scenario]
    rendered = render(values)
    for config_map in rendered.all("ConfigMap"):
        assert not CREDENTIAL_ENV & set(config_map.get("data", {})), config_map["metadata"]
    asks_airflow = bool(values.get("gc", {}).get("checkDagRuns"))
    for workload in rendered.all("Job") + rendered.all("CronJob"):
        spec = pod_spec(workload)
        for container in spec["containers"] + spec.get("initContainers", []):
            env = container_env(container)
            if asks_airflow and workload["kind"] == "CronJob":
                assert CREDENTIAL_ENV & set(env), workload["metadata"]
                assert all(env[n][0] == "secret" for n in CREDENTIAL_ENV & set(env))
                continue
            assert not CREDENTIAL_ENV & set(env), workload["metadata"]


# --------------------------------------------------------------------------- the CLI reads it


@pytest.mark.parametrize("scenario", ["defaults", "api-login-secret", "api-token-secret"])
def test_the_cli_reads_the_rendered_url_and_login(
    render: Render, clean_api_env: pytest.MonkeyPatch, scenario: str
) -> None:
    """What a pod of the official chart would have in its env (the ConfigMap, and each secret
    env resolved from a Secret holding known values) is what the CLI's API client uses."""
    from airflow_finalckpt.cli.airflow_api import api_settings

    rendered = render(SCENARIOS[scenario])
    login_secret = {"username": "ckpt-cli", "pw": "s3cret", "jwt": "eyJ.token"}
    clean_api_env.setenv(API_ENV["url"], rendered.config()[API_ENV["url"]])
    for env_name, (secret_name, key) in secret_env(rendered).items():
        if env_name in CREDENTIAL_ENV:
            assert secret_name == LOGIN_SECRET
            clean_api_env.setenv(env_name, login_secret[key])

    settings = api_settings()

    assert settings.url == rendered.config()[API_ENV["url"]].rstrip("/")
    assert settings.url_source == f"env {API_ENV['url']}"
    expected: dict[str, Any] = {
        "defaults": (None, None, None),
        "api-login-secret": (None, "ckpt-cli", "s3cret"),
        "api-token-secret": ("eyJ.token", None, None),
    }[scenario]
    assert (settings.token, settings.username, settings.password) == expected


# --------------------------------------------------------------------------- the guide


def test_operations_guide_example_gives_the_cli_its_login(render: Render) -> None:
    """docs/operations.md's production-like values render, with the CLI's login Secret, and the
    guide names the URL the chart sets by default."""
    guide = (REPO / "docs" / "operations.md").read_text()
    start = guide.index("# finalckpt-values.yaml\n")
    values = yaml.safe_load(guide[start : guide.index("```\n", start)])
    rendered = render(values)
    env = secret_env(rendered)
    assert env[API_ENV["username"]] == (LOGIN_SECRET, "username")
    assert env[API_ENV["password"]] == (LOGIN_SECRET, "password")
    assert rendered.config()[API_ENV["url"]] in guide
    assert f"--set airflow.api.existingSecret={LOGIN_SECRET}" in guide
