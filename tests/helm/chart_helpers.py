"""Helpers of the Helm chart tests: render helm/airflow-finalckpt offline with helm-python-sdk.

helm-python-sdk binds Helm's Go SDK (v4) through a bundled shared library: it loads, lints and
renders charts, and ``Chart.render`` validates the values against ``values.schema.json`` the way
``helm install``/``helm template`` do. No helm binary, no cluster, no network.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "airflow-finalckpt"
RELEASE = "finalckpt"
NAMESPACE = "airflow"
#: Kubernetes version the manifests are validated against (schemas bundled by
#: kubernetes-validate); the chart's kubeVersion allows >= 1.25.
KUBE_VERSION = "1.30"

#: The one value the chart cannot default (it renders no credential): the existing Secret with
#: the password of the store's least-privilege user (the migration Job's administrative user
#: defaults to the official chart's PostgreSQL Secret, ADMIN_SECRET).
STORE_PASSWORD_SECRET = "finalckpt-store"
STORE_PASSWORD_KEY = "password"
ADMIN_SECRET = ("secret", "airflow-postgresql", "postgres-password")
REQUIRED_VALUES: dict[str, Any] = {
    "coordinationDb": {"airflowPostgres": {"passwordSecret": {"name": STORE_PASSWORD_SECRET}}}
}


def merged(base: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    """``override`` deep-merged over ``base`` (a new dict; None values are kept: they unset)."""
    result = dict(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def with_required(values: dict[str, Any] | None) -> dict[str, Any]:
    """``values`` plus the required store password Secret (unless they name another)."""
    return merged(REQUIRED_VALUES, values)


NOTES_BEGIN = "# --- values for the official apache-airflow chart ---"
NOTES_END = "# --- end ---"


@dataclass
class Rendered:
    """A rendered release: every manifest (parsed), NOTES.txt, and lookups."""

    files: dict[str, str]
    manifests: list[dict[str, Any]] = field(default_factory=list)
    notes: str = ""

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [m for m in self.all(kind) if name is None or m["metadata"]["name"] == name]
        assert len(found) == 1, (
            f"expected one {kind} {name or ''}, found {[m['metadata']['name'] for m in found]}; "
            f"rendered: {self.names()}"
        )
        return found[0]

    def has(self, kind: str, name: str | None = None) -> bool:
        return any(name is None or m["metadata"]["name"] == name for m in self.all(kind))

    def names(self) -> list[str]:
        return sorted(f"{m['kind']}/{m['metadata']['name']}" for m in self.manifests)

    def config(self) -> dict[str, str]:
        """The settings ConfigMap's data (the AIRFLOW__FINALCKPT__* env)."""
        return dict(self.one("ConfigMap", f"{RELEASE}-config")["data"])

    def official_values(self) -> dict[str, Any]:
        """The values NOTES.txt tells the user to merge into the official chart."""
        start = self.notes.index(NOTES_BEGIN) + len(NOTES_BEGIN)
        end = self.notes.index(NOTES_END, start)
        values = yaml.safe_load(self.notes[start:end])
        assert isinstance(values, dict)
        return values

    def secret_value(self, name: str, key: str) -> str:
        secret = self.one("Secret", name)
        if key in secret.get("stringData", {}):
            return str(secret["stringData"][key])
        return base64.b64decode(secret["data"][key]).decode()


def render_chart(
    chart: Any,
    values: dict[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    raw: bool = False,
) -> Rendered:
    """Render like ``helm install`` (values validated against values.schema.json first), with
    the required store Secret added unless ``raw``.
    """
    values = values if raw else with_required(values)
    files = chart.render(values, name=release, namespace=namespace, is_install=True)
    rendered = Rendered(files=files)
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            rendered.notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                assert isinstance(doc, dict) and "kind" in doc, f"{path}: not a manifest: {doc!r}"
                doc.setdefault("metadata", {})
                rendered.manifests.append(doc)
    return rendered


def render_error(chart: Any, values: dict[str, Any], *, raw: bool = False) -> str:
    """Render bad values; return the error message (fails the test if rendering succeeds)."""
    values = values if raw else with_required(values)
    with pytest.raises(helm.HelmError) as info:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return str(info.value)


def container_env(container: dict[str, Any]) -> dict[str, Any]:
    """name -> value, or name -> ("secret", secret name, key) for secretKeyRef env."""
    env: dict[str, Any] = {}
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        env[item["name"]] = ("secret", ref["name"], ref["key"]) if ref else item.get("value")
    return env


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Job or a CronJob."""
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    result: dict[str, Any] = spec["template"]["spec"]
    return result
