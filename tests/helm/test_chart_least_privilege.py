"""Least privilege in the chart (issue 37): a dedicated database user for every Airflow pod and
Spark driver (the migration Job alone gets the administrative one), the Spark Role outside
Airflow's namespace, the code signing key from an existing Secret only, non-root pods with a
read-only root filesystem and the runtime's seccomp profile, optional NetworkPolicies, and
secrets refused by the schema where values would put them in a ConfigMap."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest
from chart_helpers import (
    ADMIN_SECRET,
    CHART_DIR,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    REPO,
    STORE_PASSWORD_KEY,
    STORE_PASSWORD_SECRET,
    Rendered,
    container_env,
    pod_spec,
    render_error,
)
from sqlalchemy.engine import make_url
from test_chart_render import K8S_MASTER, SCENARIOS, SPARK_IMAGE

Render = Callable[..., Rendered]
SIGNING = {"codeSigningKey": {"existingSecret": "finalckpt-signing"}}
K8S = {
    "spark": {
        "mode": "kubernetes",
        "master": K8S_MASTER,
        "deployMode": "cluster",
        "kubernetes": {"containerImage": SPARK_IMAGE},
    }
}
GC = {"gc": {"enabled": True}}
SCHEMA_REFUSAL = "values don't meet the specifications of the schema"


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def test_airflow_pods_connect_as_a_dedicated_user_and_only_the_job_as_admin(
    render: Render, chart: Any
) -> None:
    rendered = render(GC)
    url = make_url(rendered.config()["AIRFLOW__FINALCKPT__STORE_URL"])
    assert url.username == "finalckpt" and url.password is None
    official = {s["envName"]: s for s in rendered.official_values()["secret"]}
    password = official["AIRFLOW__FINALCKPT__STORE_PASSWORD"]
    assert (password["secretName"], password["secretKey"]) == (
        STORE_PASSWORD_SECRET,
        STORE_PASSWORD_KEY,
    )
    job = rendered.one("Job")
    init, main = pod_spec(job)["initContainers"][0], pod_spec(job)["containers"][0]
    assert container_env(main)["AIRFLOW__FINALCKPT__STORE_PASSWORD"] == ADMIN_SECRET
    assert container_env(init)["FINALCKPT_ADMIN_PASSWORD"] == ADMIN_SECRET
    admin_url = make_url(container_env(main)["AIRFLOW__FINALCKPT__STORE_URL"])
    assert admin_url.username == "postgres" and admin_url.password is None
    # the gc CronJob, like every Airflow pod, is the runtime user
    gc = container_env(pod_spec(rendered.one("CronJob"))["containers"][0])
    assert gc["AIRFLOW__FINALCKPT__STORE_PASSWORD"] != ADMIN_SECRET
    assert "FINALCKPT_ADMIN_PASSWORD" not in gc
    assert ADMIN_SECRET[1] not in str(rendered.official_values())
    superuser = {"coordinationDb": {"airflowPostgres": {"user": "postgres"}}}
    assert "/coordinationDb/airflowPostgres/user" in render_error(chart, superuser)


def test_the_spark_role_is_outside_airflows_namespace_by_default(render: Render) -> None:
    rendered = render(K8S)
    for kind in ("Role", "RoleBinding", "ServiceAccount"):
        assert rendered.one(kind)["metadata"]["namespace"] == f"{NAMESPACE}-spark", kind
    defaults = spark_defaults(rendered)
    assert defaults["spark.kubernetes.namespace"] == f"{NAMESPACE}-spark"
    assert rendered.config()["AIRFLOW_CONN_SPARK_DEFAULT"].count(f'"{NAMESPACE}-spark"') == 1


def spark_defaults(rendered: Rendered) -> dict[str, str]:
    text = rendered.one("ConfigMap", f"{RELEASE}-spark-defaults")["data"]["spark-defaults.conf"]
    pairs = [line.split(None, 1) for line in text.splitlines() if line and line[0] != "#"]
    return {k: v for k, v in pairs}


def test_the_signing_key_comes_from_an_existing_secret_only(render: Render, chart: Any) -> None:
    rendered = render({**SIGNING, **K8S})
    official = {s["envName"]: s for s in rendered.official_values()["secret"]}
    assert official["AIRFLOW__FINALCKPT__CODE_SIGNING_KEY"] == {
        "envName": "AIRFLOW__FINALCKPT__CODE_SIGNING_KEY",
        "secretName": "finalckpt-signing",
        "secretKey": "code-signing-key",
    }
    ref = "spark.kubernetes.driver.secretKeyRef.AIRFLOW__FINALCKPT__CODE_SIGNING_KEY"
    assert spark_defaults(rendered)[ref] == "finalckpt-signing:code-signing-key"
    # what the submitting task asks of a cluster-mode driver with a configured key
    from airflow_finalckpt.spark.job import STORE_URL_ENV
    from airflow_finalckpt.spark.launch.submit import missing_secret_refs
    from airflow_finalckpt.spark.secrets import CODE_KEY_ENV

    needed = [STORE_URL_ENV, CODE_KEY_ENV]
    assert missing_secret_refs(needed, spark_defaults(rendered)) == []
    assert missing_secret_refs(needed, spark_defaults(render(K8S))) == [CODE_KEY_ENV]
    for config in rendered.all("ConfigMap"):
        assert "CODE_SIGNING_KEY" not in str(config.get("data", {})).replace(ref, ""), config
    # without a Secret: nothing rendered (the deployment generates a key in its store)
    plain = render(K8S)
    assert "CODE_SIGNING_KEY" not in str(plain.files)
    # the clear-text key in the settings ConfigMap is refused
    refused = render_error(chart, {"settings": {"extra": {"code_signing_key": "k" * 32}}})
    assert SCHEMA_REFUSAL in refused


@pytest.mark.parametrize("values", [{}, GC], ids=["migration", "migration-and-gc"])
def test_job_pods_run_non_root_read_only_with_the_runtime_seccomp_profile(
    render: Render, values: dict[str, Any]
) -> None:
    rendered = render(values)
    workloads = rendered.all("Job") + rendered.all("CronJob")
    assert len(workloads) == 1 + bool(values)
    for workload in workloads:
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        scratch = {v["name"]: v for v in spec["volumes"]}["finalckpt-tmp"]
        assert scratch == {"name": "finalckpt-tmp", "emptyDir": {}}
        for container in containers(workload):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, container["name"]
            assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts["/tmp"] == "finalckpt-tmp", container["name"]
            assert container_env(container)["AIRFLOW_HOME"] == "/tmp/airflow"  # writable


def test_network_policies_are_optional_and_valid(render: Render) -> None:
    assert not render(K8S).all("NetworkPolicy")
    extra = [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 443}]}]
    rendered = render({**K8S, "networkPolicy": {"enabled": True, "jobsExtraEgress": extra}})
    jobs = rendered.one("NetworkPolicy", f"{RELEASE}-jobs")
    spark = rendered.one("NetworkPolicy", f"{RELEASE}-spark")
    for policy in (jobs, spark):
        kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
    assert jobs["metadata"]["namespace"] == NAMESPACE
    assert jobs["spec"]["ingress"] == [] and set(jobs["spec"]["policyTypes"]) == {
        "Ingress",
        "Egress",
    }
    ports = [p["port"] for rule in jobs["spec"]["egress"] for p in rule.get("ports", [])]
    assert ports == [53, 53, 5432, 443]
    job_labels = pod_spec(rendered.one("Job"))  # the policy selects the job pods
    selected = jobs["spec"]["podSelector"]["matchLabels"]
    template_labels = rendered.one("Job")["spec"]["template"]["metadata"]["labels"]
    assert job_labels and selected.items() <= template_labels.items()
    assert spark["metadata"]["namespace"] == f"{NAMESPACE}-spark"
    sources = spark["spec"]["ingress"][0]["from"]
    assert {"podSelector": {}} in sources
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    } in sources
    local = render({"networkPolicy": {"enabled": True}})
    assert [p["metadata"]["name"] for p in local.all("NetworkPolicy")] == [f"{RELEASE}-jobs"]


SECRET_VALUES = {
    "spark.conf s3a secret key": {"spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "x"}}},
    "spark.conf s3a access key": {"spark": {"conf": {"spark.hadoop.fs.s3a.access.key": "x"}}},
    "spark.conf password": {"spark": {"conf": {"spark.ssl.keyStorePassword": "x"}}},
    "spark.conf token": {"spark": {"conf": {"spark.some.auth.token": "x"}}},
    "storage option secret": {
        "checkpointStorage": {"objectStore": {"storageOptions": {"secret": "x"}}}
    },
    "storage option token": {
        "checkpointStorage": {"objectStore": {"storageOptions": {"token": "x"}}}
    },
    "nested storage option": {
        "checkpointStorage": {
            "objectStore": {"storageOptions": {"client_kwargs": {"aws_secret_access_key": "x"}}}
        }
    },
    "settings.extra password": {"settings": {"extra": {"warehouse_password": "x"}}},
}


@pytest.mark.parametrize("case", sorted(SECRET_VALUES))
def test_secrets_in_configmap_values_are_refused(chart: Any, case: str) -> None:
    assert SCHEMA_REFUSAL in render_error(chart, SECRET_VALUES[case])


def test_secret_references_and_plain_options_pass(render: Render) -> None:
    rendered = render(
        {
            "spark": {
                "conf": {
                    "spark.kubernetes.driver.secretKeyRef.AWS_SECRET_ACCESS_KEY": "s3:secret",
                    "spark.kubernetes.executor.secrets.spark-s3": "/etc/s3",
                    "spark.executor.memory": "4g",
                }
            },
            "checkpointStorage": {
                "mode": "objectStore",
                "objectStore": {
                    "uri": "s3://bucket/ckpt",
                    "storageOptions": {"client_kwargs": {"endpoint_url": "http://minio:9000"}},
                },
            },
        }
    )
    assert "secretKeyRef.AWS_SECRET_ACCESS_KEY s3:secret" in str(rendered.files)


def test_verify_full_is_documented() -> None:
    values = (CHART_DIR / "values.yaml").read_text()
    guide = (REPO / "docs" / "operations.md").read_text()
    assert "verify-full" in values and "sslrootcert" in guide and "verify-full" in guide
    assert (
        SCENARIOS["airflow-postgres-custom"]["coordinationDb"]["airflowPostgres"]["sslmode"]
        == "verify-full"
    )
