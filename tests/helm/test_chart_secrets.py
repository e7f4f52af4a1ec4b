"""Secure defaults of the chart (issue 27): no default password, no credential ever rendered,
TLS to the store by default, credentials only from existing Secrets (Spark drivers included),
and the migration Job as the only workload that changes the store's schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from chart_helpers import (
    STORE_PASSWORD_KEY,
    STORE_PASSWORD_SECRET,
    Rendered,
    container_env,
    pod_spec,
    render_error,
)
from test_chart_render import SCENARIOS, SPARK_IMAGE

Render = Callable[..., Rendered]

PLANTED = "Planted-Pw-7f3c9e"
K8S_CLUSTER = {
    "spark": {
        "mode": "kubernetes",
        "master": "k8s://https://kubernetes.default.svc:443",
        "deployMode": "cluster",
        "kubernetes": {"namespace": "spark-jobs", "containerImage": SPARK_IMAGE},
    }
}
#: Places a user might put a password in: each must be refused when the chart renders.
PLANTED_PASSWORDS: dict[str, dict[str, Any]] = {
    "the old store password value": {"coordinationDb": {"airflowPostgres": {"password": PLANTED}}},
    "the old external URL value": {
        "coordinationDb": {
            "mode": "external",
            "external": {"url": f"postgresql+psycopg://u:{PLANTED}@pg:5432/finalckpt"},
        }
    },
    "store_password in the settings ConfigMap": {
        "settings": {"extra": {"store_password": PLANTED}}
    },
    "store_url in the settings ConfigMap": {
        "settings": {"extra": {"store_url": f"postgresql://u:{PLANTED}@pg/db"}}
    },
    "the CLI's password as a value": {"airflow": {"api": {"password": PLANTED}}},
}


def all_text(rendered: Rendered) -> str:
    return "\n".join(rendered.files.values())


def every_container(rendered: Rendered) -> list[dict[str, Any]]:
    containers = []
    for workload in rendered.all("Job") + rendered.all("CronJob"):
        spec = pod_spec(workload)
        containers += spec.get("initContainers", []) + spec["containers"]
    return containers


# --------------------------------------------------------------------------- no default password


def test_the_defaults_alone_do_not_render_and_name_the_secret_to_give(chart: Any) -> None:
    message = render_error(chart, {}, raw=True)
    assert "coordinationDb.airflowPostgres.passwordSecret.name is required" in message
    assert "finalckpt-store" in message  # the Secret to create, as the example
    external = render_error(chart, {"coordinationDb": {"mode": "external"}}, raw=True)
    assert "/coordinationDb/external" in external, external


def test_values_yaml_holds_no_password() -> None:
    from chart_helpers import CHART_DIR

    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if re.search("password|secret|token", str(key), re.I) and isinstance(value, str):
                    # only names of Secrets and keys, never a value: key names or ""
                    assert value in ("", "password", "username", "postgres-password"), path + key
                walk(value, f"{path}{key}.")

    walk(values, "")
    assert values["coordinationDb"]["airflowPostgres"]["passwordSecret"]["name"] == ""
    assert values["coordinationDb"]["airflowPostgres"]["sslmode"] == "require"
    assert "password" not in values["coordinationDb"]["airflowPostgres"]
    assert "url" not in values["coordinationDb"]["external"]


@pytest.mark.parametrize("case", sorted(PLANTED_PASSWORDS))
def test_a_planted_password_is_refused_and_never_rendered(chart: Any, case: str) -> None:
    message = render_error(chart, PLANTED_PASSWORDS[case])
    assert "values don't meet the specifications of the schema" in message, message


@pytest.mark.parametrize("scenario", sorted([*SCENARIOS, "k8s-cluster"]))
def test_no_credential_in_any_rendered_manifest(render: Render, scenario: str) -> None:
    """No Secret of the chart's own; every credential-looking env comes from a secretKeyRef;
    every URL rendered (ConfigMaps, spark-defaults, NOTES) has no password."""
    rendered = render(K8S_CLUSTER if scenario == "k8s-cluster" else SCENARIOS[scenario])
    assert not rendered.all("Secret")
    for container in every_container(rendered):
        for item in container.get("env", []):
            if re.search("PASSWORD|TOKEN|SECRET|_KEY$", item["name"]):
                assert "secretKeyRef" in item.get("valueFrom", {}), item
            if "STORE_URL" in item["name"] and "value" in item:  # the chart's: no password
                userinfo = item["value"].split("://", 1)[1].split("@", 1)[0]
                assert ":" not in userinfo, item
    for url in re.findall(r"postgres\S*://[^\s\"']+", all_text(rendered)):
        userinfo = url.split("://", 1)[1].split("@", 1)
        assert len(userinfo) == 1 or ":" not in userinfo[0], url
    for official in rendered.official_values()["secret"]:
        assert set(official) == {"envName", "secretName", "secretKey"}


# --------------------------------------------------------------------------- TLS


def test_the_store_url_asks_for_tls_by_default_and_dev_can_turn_it_off(render: Render) -> None:
    url = render().config()["AIRFLOW__FINALCKPT__STORE_URL"]
    assert url.endswith("?sslmode=require"), url
    dev = render({"coordinationDb": {"airflowPostgres": {"sslmode": "disable"}}})
    assert dev.config()["AIRFLOW__FINALCKPT__STORE_URL"].endswith("?sslmode=disable")


# --------------------------------------------------------------------------- Spark drivers


def test_a_kubernetes_cluster_driver_gets_the_store_credential_by_secret_reference(
    render: Render,
) -> None:
    from test_chart_render import _spark_defaults

    rendered = render(K8S_CLUSTER)
    defaults = _spark_defaults(rendered)
    assert defaults["spark.kubernetes.driver.secretKeyRef.AIRFLOW__FINALCKPT__STORE_PASSWORD"] == (
        f"{STORE_PASSWORD_SECRET}:{STORE_PASSWORD_KEY}"
    )
    driver_url = defaults["spark.kubernetes.driverEnv.AIRFLOW__FINALCKPT__STORE_URL"]
    assert driver_url == rendered.config()["AIRFLOW__FINALCKPT__STORE_URL"]
    external = render({**K8S_CLUSTER, **SCENARIOS["external-db-existing-secret"]})
    ext_defaults = _spark_defaults(external)
    assert ext_defaults["spark.kubernetes.driver.secretKeyRef.AIRFLOW__FINALCKPT__STORE_URL"] == (
        "finalckpt-db:store-url"
    )
    assert not any("driverEnv" in key for key in ext_defaults)
    client = render({"spark": {**K8S_CLUSTER["spark"], "deployMode": "client"}})
    assert not any("secretKeyRef" in key for key in _spark_defaults(client))


def test_the_submitting_task_accepts_the_rendered_secret_references(
    render: Render, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the task checks before a Kubernetes cluster-mode submission (spark/launch/submit.py)
    is satisfied by the rendered spark-defaults.conf, and the driver joins URL and password."""
    from airflow_finalckpt.spark.job import STORE_URL_ENV
    from airflow_finalckpt.spark.launch.submit import missing_secret_refs, spark_defaults
    from airflow_finalckpt.store_password import STORE_PASSWORD_ENV, with_store_password

    text = render(K8S_CLUSTER).one("ConfigMap", "finalckpt-spark-defaults")["data"]
    (tmp_path / "spark-defaults.conf").write_text(text["spark-defaults.conf"])
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    conf = spark_defaults()
    assert missing_secret_refs([STORE_URL_ENV], conf) == []
    assert missing_secret_refs([STORE_URL_ENV], {}) == [STORE_URL_ENV]
    monkeypatch.setenv(STORE_PASSWORD_ENV, PLANTED)
    url = conf[f"spark.kubernetes.driverEnv.{STORE_URL_ENV}"]
    assert PLANTED not in url
    assert f":{PLANTED}@" in with_store_password(url)


# --------------------------------------------------------------------------- migrations


@pytest.mark.parametrize("scenario", sorted([*SCENARIOS, "k8s-cluster"]))
def test_only_the_migration_hook_job_migrates(render: Render, scenario: str) -> None:
    rendered = render(K8S_CLUSTER if scenario == "k8s-cluster" else SCENARIOS[scenario])
    upgraders = []
    for workload in rendered.all("Job") + rendered.all("CronJob"):
        for container in pod_spec(workload)["containers"]:
            command = " ".join(container.get("command", []) + container.get("args", []))
            if "db upgrade" in command or "db migrate" in command:
                upgraders.append((workload["kind"], workload["metadata"]["name"]))
            assert "AIRFLOW__FINALCKPT__AUTO_MIGRATE" not in container_env(container)
    migrating = rendered.all("Job") and SCENARIOS.get(scenario, {}).get("migration") is None
    assert upgraders == ([("Job", "finalckpt-db-migrate")] if migrating else [])
    if migrating:
        annotations = rendered.one("Job")["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "AIRFLOW__FINALCKPT__AUTO_MIGRATE" not in rendered.config()
    official = rendered.official_values()
    assert all(s["envName"] != "AIRFLOW__FINALCKPT__AUTO_MIGRATE" for s in official["secret"])


def test_auto_migrate_cannot_be_turned_on_through_the_chart(chart: Any) -> None:
    message = render_error(chart, {"settings": {"extra": {"auto_migrate": True}}})
    assert "'/settings/extra/auto_migrate'" in message
