"""Render the chart for its default values and for every documented option; validate every
manifest against the Kubernetes schemas; assert the wiring (env, volumes, secrets, RBAC, hooks).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart_helpers import (
    ADMIN_SECRET,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    STORE_PASSWORD_KEY,
    STORE_PASSWORD_SECRET,
    Rendered,
    container_env,
    pod_spec,
    with_required,
)

from tests.extras import import_extra

Render = Callable[..., Rendered]

K8S_MASTER = "k8s://https://kubernetes.default.svc:443"
SPARK_IMAGE = "registry.example.com/spark-finalckpt:4.2.0"

STORE_PASSWORD_REF = ("secret", STORE_PASSWORD_SECRET, STORE_PASSWORD_KEY)

#: Every documented option (values.yaml comments, docs/operations.md), one scenario each; each
#: names the store password's Secret (with_required below), the one value without a default.
SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-db-existing-secret": {
        "coordinationDb": {
            "mode": "external",
            "external": {"existingSecret": {"name": "finalckpt-db", "key": "store-url"}},
        }
    },
    "airflow-postgres-custom": {
        "airflow": {"releaseName": "prod-airflow"},
        "coordinationDb": {
            "airflowPostgres": {
                "user": "ckpt owner+1",
                "passwordSecret": {"name": "ckpt-db", "key": "pw"},
                "database": "ckpt",
                "sslmode": "verify-full",
            }
        },
    },
    "object-store": {
        "checkpointStorage": {
            "mode": "objectStore",
            "objectStore": {
                "uri": "s3a://checkpoints/finalckpt",
                "storageOptions": {"client_kwargs": {"endpoint_url": "http://minio.minio:9000"}},
                "credentials": {
                    "existingSecret": "s3-credentials",
                    "env": {
                        "AWS_ACCESS_KEY_ID": "access-key-id",
                        "AWS_SECRET_ACCESS_KEY": "secret-access-key",
                    },
                },
            },
        }
    },
    "pvc-existing-claim": {"checkpointStorage": {"pvc": {"existingClaim": "shared-ckpt"}}},
    "pvc-storage-class": {
        "checkpointStorage": {"pvc": {"storageClass": "efs-sc", "size": "200Gi"}}
    },
    "spark-standalone": {
        "spark": {
            "mode": "standalone",
            "master": "spark://spark-master.spark.svc:7077",
            "deployMode": "cluster",
        }
    },
    "spark-kubernetes": {
        "spark": {
            "mode": "kubernetes",
            "master": K8S_MASTER,
            "deployMode": "cluster",
            "conf": {"spark.executor.instances": 4, "spark.executor.memory": "4g"},
            "kubernetes": {"namespace": "spark-jobs", "containerImage": SPARK_IMAGE},
        }
    },
    "spark-kubernetes-no-rbac": {
        "spark": {
            "mode": "kubernetes",
            "master": K8S_MASTER,
            "kubernetes": {
                "containerImage": SPARK_IMAGE,
                "rbac": {"create": False},
                "serviceAccount": {"create": False, "name": "spark-driver"},
            },
        }
    },
    "spark-yarn": {"spark": {"mode": "yarn", "connectionExtra": {"queue": "etl"}}},
    "spark-connect": {"spark": {"mode": "connect", "master": "sc://spark-connect.spark:15002"}},
    "gc": {
        "gc": {
            "enabled": True,
            "schedule": "@hourly",
            "pipelines": ["flights.manual__2024-01-01", "nightly"],
            "graceSeconds": 900,
        }
    },
    "gc-retention": {
        "gc": {"enabled": True, "schedule": "@daily", "savepoints": True, "checkDagRuns": True},
        "settings": {"retentionDays": 30},
        "airflow": {"api": {"existingSecret": "finalckpt-airflow-api"}},
    },
    "migration-disabled": {"migration": {"enabled": False}},
    "api-login-secret": {
        "airflow": {"api": {"existingSecret": "finalckpt-airflow-api", "passwordKey": "pw"}}
    },
    "api-token-secret": {
        "airflow": {
            "api": {
                "url": "https://airflow-internal.example.com:8443/",
                "existingSecret": "finalckpt-airflow-api",
                "tokenKey": "jwt",
            }
        }
    },
    "settings-and-jobs": {
        "settings": {
            "checkpointIntervalS": 30,
            "retainCheckpoints": 5,
            "extra": {"some_future_key": "x"},
        },
        "image": {"repository": "registry.example.com/airflow-finalckpt", "tag": "0.1.0-rc1"},
        "imagePullSecrets": [{"name": "regcred"}],
        "jobs": {"nodeSelector": {"pool": "batch"}, "serviceAccountName": "finalckpt-jobs"},
        "airflow": {"apiServerUrl": "https://airflow.example.com/"},
    },
}
SCENARIOS = {name: with_required(values) for name, values in SCENARIOS.items()}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_manifest_validates_against_kubernetes_schema(render: Render, scenario: str) -> None:
    rendered = render(SCENARIOS[scenario])
    assert rendered.manifests, "nothing rendered"
    assert rendered.notes, "NOTES.txt rendered empty"
    for manifest in rendered.manifests:
        name = f"{manifest['kind']}/{manifest['metadata'].get('name')}"
        try:
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.absolute_path)
            pytest.fail(f"{scenario}: {name} invalid at {path or '/'}: {exc.message}")
        labels = manifest["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/instance") == RELEASE, name
        assert labels.get("app.kubernetes.io/part-of") == "airflow-finalckpt", name


def test_validator_rejects_a_broken_manifest(render: Render) -> None:
    """The schema check above can fail: a typo in a Job spec is caught."""
    job = render().one("Job")
    pod_spec(job)["containers"][0]["envFrm"] = []
    with pytest.raises(kubernetes_validate.ValidationError, match="envFrm"):
        kubernetes_validate.validate(job, KUBE_VERSION, strict=True)


# --------------------------------------------------------------------------- defaults


def test_default_install(render: Render) -> None:
    rendered = render()
    assert rendered.names() == sorted(
        [
            f"ConfigMap/{RELEASE}-config",
            f"ConfigMap/{RELEASE}-spark-defaults",
            f"Job/{RELEASE}-db-migrate",
            f"PersistentVolumeClaim/{RELEASE}-checkpoints",
        ]
    )  # no Secret: the store's password is in one the user made (the official chart's here)
    for manifest in rendered.manifests:
        assert manifest["metadata"]["namespace"] == NAMESPACE
    config = rendered.config()
    assert config == {
        # a database on the official chart's PostgreSQL: no password, TLS required
        "AIRFLOW__FINALCKPT__STORE_URL": (
            "postgresql+psycopg://finalckpt@airflow-postgresql.airflow.svc:5432/finalckpt"
            "?sslmode=require"
        ),
        "AIRFLOW__FINALCKPT__STORAGE_URI": "/opt/airflow/finalckpt/checkpoints",
        "AIRFLOW__FINALCKPT__CHECKPOINT_INTERVAL_S": "60",
        "AIRFLOW__FINALCKPT__CHECKPOINT_TIMEOUT_S": "600",
        "AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS": "3",
        "AIRFLOW__FINALCKPT__TARGET_BATCH_S": "30",
        "AIRFLOW__FINALCKPT__RETENTION_DAYS": "7",
        # the finalckpt CLI (restore) -> the official chart's api-server Service in the cluster
        "AIRFLOW__FINALCKPT__API_URL": "http://airflow-api-server.airflow.svc:8080",
        "SPARK_CONF_DIR": "/opt/finalckpt/spark-conf",
    }
    # the migration Job upgrades as the administrative user (the official chart's postgres)
    job_env = container_env(pod_spec(rendered.one("Job"))["containers"][0])
    assert job_env["AIRFLOW__FINALCKPT__STORE_PASSWORD"] == ADMIN_SECRET
    assert job_env["AIRFLOW__FINALCKPT__STORE_URL"].startswith("postgresql+psycopg://postgres@")
    pvc = rendered.one("PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert "storageClassName" not in pvc["spec"]  # the cluster's default class
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_release_name_without_finalckpt_is_prefixed(render: Render) -> None:
    rendered = render(release="analytics", namespace="data")
    assert rendered.has("ConfigMap", "analytics-finalckpt-config")
    assert all(m["metadata"]["namespace"] == "data" for m in rendered.manifests)
    config = rendered.one("ConfigMap", "analytics-finalckpt-config")["data"]
    assert "@airflow-postgresql.data.svc:5432/" in config["AIRFLOW__FINALCKPT__STORE_URL"]
    assert config["AIRFLOW__FINALCKPT__API_URL"] == "http://airflow-api-server.data.svc:8080"


# --------------------------------------------------------------------------- migration hook


def _hook(manifest: dict[str, Any]) -> tuple[set[str], int]:
    annotations = manifest["metadata"].get("annotations", {})
    events = {e.strip() for e in annotations.get("helm.sh/hook", "").split(",") if e.strip()}
    return events, int(annotations.get("helm.sh/hook-weight", "0"))


@pytest.mark.parametrize("scenario", ["defaults", "external-db-existing-secret", "object-store"])
def test_migration_job_is_a_hook_after_what_it_reads(render: Render, scenario: str) -> None:
    rendered = render(SCENARIOS[scenario])
    job = rendered.one("Job", f"{RELEASE}-db-migrate")
    job_events, job_weight = _hook(job)
    assert job_events == {"pre-install", "pre-upgrade"}
    assert job["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"

    spec = pod_spec(job)
    main = spec["containers"][0]
    assert main["command"] + main["args"] == ["finalckpt", "db", "upgrade"]
    env = container_env(main)
    store_env = "AIRFLOW__FINALCKPT__STORE_" + ("URL" if "external" in scenario else "PASSWORD")
    assert env[store_env][0] == "secret"
    assert "AIRFLOW__FINALCKPT__AUTO_MIGRATE" not in env
    # Everything the pod reads that this chart creates must be a hook of the same events with
    # a LOWER weight: non-hook resources do not exist yet before an install.
    referenced: list[tuple[str, str]] = []
    for container in spec.get("initContainers", []) + spec["containers"]:
        referenced += [
            ("ConfigMap", e["configMapRef"]["name"]) for e in container.get("envFrom", [])
        ]
        referenced += [
            ("Secret", e["valueFrom"]["secretKeyRef"]["name"])
            for e in container.get("env", [])
            if "valueFrom" in e
        ]
    scratch = [{"name": "finalckpt-tmp", "emptyDir": {}}]  # its own, not a chart resource
    assert spec.get("volumes", []) == scratch, "the migration job must not mount non-hook volumes"
    assert ("ConfigMap", f"{RELEASE}-config") in referenced
    for kind, name in referenced:
        if not rendered.has(kind, name):
            continue  # an existing Secret the user manages
        events, weight = _hook(rendered.one(kind, name))
        assert job_events <= events, f"{kind}/{name} is not a {job_events} hook"
        assert weight < job_weight, f"{kind}/{name} weight {weight} !< job weight {job_weight}"


def test_migration_creates_the_database_only_on_the_airflow_postgres(render: Render) -> None:
    default_spec = pod_spec(render().one("Job"))
    init = default_spec["initContainers"]
    assert [c["name"] for c in init] == ["prepare-database"]
    assert "CREATE DATABASE" in init[0]["args"][0]
    assert container_env(init[0])["AIRFLOW__FINALCKPT__STORE_PASSWORD"] == STORE_PASSWORD_REF
    assert init[0]["envFrom"] == [{"configMapRef": {"name": f"{RELEASE}-config"}}]
    external_spec = pod_spec(render(SCENARIOS["external-db-existing-secret"]).one("Job"))
    assert "initContainers" not in external_spec
    # without creating the database it still grants the runtime user its privileges
    no_create = render({"coordinationDb": {"airflowPostgres": {"createDatabase": False}}})
    script = pod_spec(no_create.one("Job"))["initContainers"][0]["args"][0]
    assert "create_database = False" in script and "GRANT SELECT, INSERT" in script


def test_migration_job_resources_and_security(render: Render) -> None:
    spec = pod_spec(render({"migration": {"resources": {"requests": {"cpu": "1"}}}}).one("Job"))
    container = spec["containers"][0]
    assert container["resources"]["requests"]["cpu"] == "1"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsUser"] == 50000


def test_migration_disabled_renders_no_job(render: Render) -> None:
    assert not render(SCENARIOS["migration-disabled"]).all("Job")


# --------------------------------------------------------------------------- coordination DB


def test_external_db_existing_secret_is_referenced_not_created(render: Render) -> None:
    rendered = render(SCENARIOS["external-db-existing-secret"])
    assert not rendered.all("Secret")
    assert "AIRFLOW__FINALCKPT__STORE_URL" not in rendered.config()
    env = container_env(pod_spec(rendered.one("Job"))["containers"][0])
    assert env["AIRFLOW__FINALCKPT__STORE_URL"] == ("secret", "finalckpt-db", "store-url")
    assert "AIRFLOW__FINALCKPT__STORE_PASSWORD" not in env
    official = rendered.official_values()
    assert official["secret"] == [
        {
            "envName": "AIRFLOW__FINALCKPT__STORE_URL",
            "secretName": "finalckpt-db",
            "secretKey": "store-url",
        }
    ]


def test_airflow_postgres_url_escapes_the_user_and_holds_no_password(render: Render) -> None:
    from sqlalchemy.engine import make_url

    rendered = render(SCENARIOS["airflow-postgres-custom"])
    url = make_url(rendered.config()["AIRFLOW__FINALCKPT__STORE_URL"])
    assert url.drivername == "postgresql+psycopg"
    assert url.host == "prod-airflow-postgresql.airflow.svc"
    assert url.username == "ckpt owner+1"
    assert url.password is None
    assert url.database == "ckpt"
    assert dict(url.query) == {"sslmode": "verify-full"}
    official = {s["envName"]: s for s in rendered.official_values()["secret"]}
    password = official["AIRFLOW__FINALCKPT__STORE_PASSWORD"]
    assert (password["secretName"], password["secretKey"]) == ("ckpt-db", "pw")
    env = container_env(pod_spec(rendered.one("Job"))["containers"][0])  # as the admin
    assert env["AIRFLOW__FINALCKPT__STORE_PASSWORD"] == (
        "secret",
        "prod-airflow-postgresql",
        "postgres-password",
    )


# --------------------------------------------------------------------------- storage


def test_pvc_storage_is_mounted_where_the_storage_uri_points(render: Render) -> None:
    rendered = render(SCENARIOS["gc"])
    claim = rendered.one("PersistentVolumeClaim")["metadata"]["name"]
    spec = pod_spec(rendered.one("CronJob"))
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert volumes["finalckpt-checkpoints"]["persistentVolumeClaim"]["claimName"] == claim
    assert (
        mounts["finalckpt-checkpoints"]["mountPath"]
        == rendered.config()["AIRFLOW__FINALCKPT__STORAGE_URI"]
    )
    assert set(mounts) <= set(volumes)


def test_pvc_existing_claim_and_storage_class(render: Render) -> None:
    existing = render(SCENARIOS["pvc-existing-claim"])
    assert not existing.all("PersistentVolumeClaim")
    volumes = existing.official_values()["volumes"]
    assert {
        "name": "finalckpt-checkpoints",
        "persistentVolumeClaim": {"claimName": "shared-ckpt"},
    } in volumes
    pvc = render(SCENARIOS["pvc-storage-class"]).one("PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == "efs-sc"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "200Gi"
    static = render({"checkpointStorage": {"pvc": {"storageClass": "-"}}})
    assert static.one("PersistentVolumeClaim")["spec"]["storageClassName"] == ""


def test_object_store_uri_options_and_credentials(render: Render) -> None:
    rendered = render(SCENARIOS["object-store"])
    assert not rendered.all("PersistentVolumeClaim")
    config = rendered.config()
    assert config["AIRFLOW__FINALCKPT__STORAGE_URI"] == "s3a://checkpoints/finalckpt"
    assert config["AIRFLOW__FINALCKPT__STORAGE_OPTIONS"] == (
        '{"client_kwargs":{"endpoint_url":"http://minio.minio:9000"}}'
    )
    expected = {
        "AWS_ACCESS_KEY_ID": ("secret", "s3-credentials", "access-key-id"),
        "AWS_SECRET_ACCESS_KEY": ("secret", "s3-credentials", "secret-access-key"),
    }
    env = container_env(pod_spec(rendered.one("Job"))["containers"][0])
    assert not set(expected) & set(env)  # the migration Job touches the store only
    official = rendered.official_values()
    assert {(s["envName"], s["secretName"], s["secretKey"]) for s in official["secret"]} >= {
        (k, v[1], v[2]) for k, v in expected.items()
    }
    assert all("persistentVolumeClaim" not in v for v in official["volumes"])


# --------------------------------------------------------------------------- Spark


def _spark_connection(rendered: Rendered, conn_env: str = "AIRFLOW_CONN_SPARK_DEFAULT") -> Any:
    return json.loads(rendered.config()[conn_env])


def _spark_defaults(rendered: Rendered) -> dict[str, str]:
    text = rendered.one("ConfigMap", f"{RELEASE}-spark-defaults")["data"]["spark-defaults.conf"]
    pairs = [line.split(None, 1) for line in text.splitlines() if line and line[0] != "#"]
    return {k: v for k, v in pairs}


def test_local_spark_renders_no_connection(render: Render) -> None:
    rendered = render()
    assert not any(k.startswith("AIRFLOW_CONN_") for k in rendered.config())
    assert _spark_defaults(rendered) == {}
    assert not rendered.all("Role") and not rendered.all("ServiceAccount")


def test_spark_standalone_connection(render: Render) -> None:
    conn = _spark_connection(render(SCENARIOS["spark-standalone"]))
    assert conn == {
        "conn_type": "spark",
        "host": "spark://spark-master.spark.svc:7077",
        "extra": {"deploy-mode": "cluster"},
    }


def test_spark_yarn_connection(render: Render) -> None:
    conn = _spark_connection(render(SCENARIOS["spark-yarn"]))
    assert conn == {
        "conn_type": "spark",
        "host": "yarn",
        "extra": {"deploy-mode": "client", "queue": "etl"},
    }


def test_spark_connect_connections(render: Render) -> None:
    rendered = render(SCENARIOS["spark-connect"])
    assert _spark_connection(rendered)["host"] == "sc://spark-connect.spark:15002"
    assert _spark_connection(rendered, "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT") == {
        "conn_type": "spark_connect",
        "host": "sc://spark-connect.spark:15002",
    }
    assert not rendered.all("Role")


def test_spark_on_kubernetes_rbac_and_defaults(render: Render) -> None:
    rendered = render(SCENARIOS["spark-kubernetes"])
    conn = _spark_connection(rendered)
    assert conn["host"] == K8S_MASTER
    assert conn["extra"] == {"deploy-mode": "cluster", "namespace": "spark-jobs"}

    sa = rendered.one("ServiceAccount", f"{RELEASE}-spark")
    assert sa["metadata"]["namespace"] == "spark-jobs"
    role = rendered.one("Role", f"{RELEASE}-spark")
    assert role["metadata"]["namespace"] == "spark-jobs"
    granted = {
        (resource, verb)
        for rule in role["rules"]
        if rule["apiGroups"] == [""]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for resource in ("pods", "services", "configmaps", "persistentvolumeclaims"):
        for verb in ("create", "get", "list", "watch", "delete", "deletecollection"):
            assert (resource, verb) in granted, (resource, verb)
    assert ("pods/log", "get") in granted
    assert not any("secrets" in rule["resources"] for rule in role["rules"])

    binding = rendered.one("RoleBinding", f"{RELEASE}-spark")
    assert binding["metadata"]["namespace"] == "spark-jobs"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    subjects = {(s["kind"], s["name"], s["namespace"]) for s in binding["subjects"]}
    assert subjects == {
        ("ServiceAccount", f"{RELEASE}-spark", "spark-jobs"),  # the driver (cluster mode)
        ("ServiceAccount", "airflow-worker", NAMESPACE),  # spark-submit / client-mode driver
    }
    assert _spark_defaults(rendered) == {
        "spark.executor.instances": "4",
        "spark.executor.memory": "4g",
        "spark.kubernetes.authenticate.driver.serviceAccountName": f"{RELEASE}-spark",
        "spark.kubernetes.container.image": SPARK_IMAGE,
        "spark.kubernetes.namespace": "spark-jobs",
        # the cluster-mode driver's store credential, by Secret reference (test_chart_secrets)
        "spark.kubernetes.driver.secretKeyRef.AIRFLOW__FINALCKPT__STORE_PASSWORD": (
            f"{STORE_PASSWORD_SECRET}:{STORE_PASSWORD_KEY}"
        ),
        "spark.kubernetes.driverEnv.AIRFLOW__FINALCKPT__STORE_URL": (
            "postgresql+psycopg://finalckpt@airflow-postgresql.airflow.svc:5432/finalckpt"
            "?sslmode=require"
        ),
    }


def test_spark_on_kubernetes_without_rbac_uses_the_given_service_account(render: Render) -> None:
    rendered = render(SCENARIOS["spark-kubernetes-no-rbac"])
    assert not rendered.all("Role") and not rendered.all("RoleBinding")
    assert not rendered.all("ServiceAccount")
    defaults = _spark_defaults(rendered)
    assert defaults["spark.kubernetes.authenticate.driver.serviceAccountName"] == "spark-driver"
    assert defaults["spark.kubernetes.namespace"] == f"{NAMESPACE}-spark"  # not Airflow's


def test_spark_submitter_service_accounts(render: Render) -> None:
    spark = SCENARIOS["spark-kubernetes"]["spark"]
    values = {
        "spark": {
            **spark,
            "kubernetes": {
                **spark["kubernetes"],
                "submitterServiceAccounts": ["airflow-scheduler", "airflow-worker"],
            },
        }
    }
    binding = render(values).one("RoleBinding")
    names = sorted(s["name"] for s in binding["subjects"] if s["namespace"] == NAMESPACE)
    assert names == ["airflow-scheduler", "airflow-worker"]


def test_spark_connections_resolve_through_the_provider_hooks(
    render: Render, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered connection env is what the Spark provider's hooks really read."""
    import_extra("airflow.providers.apache.spark", "airflow")
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    cases = {
        "spark-standalone": ("spark://spark-master.spark.svc:7077", "cluster"),
        "spark-yarn": ("yarn", "client"),
        "spark-connect": ("sc://spark-connect.spark:15002", None),
    }
    for scenario, (master, deploy_mode) in cases.items():
        config = render(SCENARIOS[scenario]).config()
        for key, value in config.items():
            if key.startswith("AIRFLOW_CONN_"):
                monkeypatch.setenv(key, value)
        resolved = SparkSubmitHook(conn_id="spark_default")._resolve_connection()
        assert (resolved["master"], resolved["deploy_mode"]) == (master, deploy_mode), scenario
    assert SparkConnectHook().get_connection_url() == "sc://spark-connect.spark:15002/"


# --------------------------------------------------------------------------- GC CronJob


def test_gc_cronjob(render: Render) -> None:
    rendered = render(SCENARIOS["gc"])
    cron = rendered.one("CronJob", f"{RELEASE}-gc")
    assert cron["spec"]["schedule"] == "@hourly"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    spec = pod_spec(cron)
    container = spec["containers"][0]
    script = container["args"][0]
    assert "for key in 'flights.manual__2024-01-01' 'nightly' ;" in script
    assert 'finalckpt gc --pipeline "$key" --grace 900 || status=1' in script
    assert "--dry-run" not in script
    assert container["envFrom"] == [{"configMapRef": {"name": f"{RELEASE}-config"}}]
    assert container_env(container)["AIRFLOW__FINALCKPT__STORE_PASSWORD"] == STORE_PASSWORD_REF
    assert container["resources"]["limits"]["memory"] == "1Gi"
    dry = render({"gc": {**SCENARIOS["gc"]["gc"], "dryRun": True}}).one("CronJob")
    assert "--grace 900 --dry-run" in pod_spec(dry)["containers"][0]["args"][0]


def test_gc_cronjob_without_keys_runs_retention_over_every_pipeline(render: Render) -> None:
    rendered = render(SCENARIOS["gc-retention"])
    script = pod_spec(rendered.one("CronJob"))["containers"][0]["args"][0]
    assert "exec finalckpt gc --grace 600 --savepoints --check-dag-runs" in script
    assert "--pipeline" not in script
    env = container_env(pod_spec(rendered.one("CronJob"))["containers"][0])
    assert env["AIRFLOW__FINALCKPT__API_USERNAME"] == (
        "secret",
        "finalckpt-airflow-api",
        "username",
    )
    assert env["AIRFLOW__FINALCKPT__API_PASSWORD"] == (
        "secret",
        "finalckpt-airflow-api",
        "password",
    )
    assert rendered.config()["AIRFLOW__FINALCKPT__RETENTION_DAYS"] == "30"
    default = render({"gc": {"enabled": True}}).one("CronJob")
    assert pod_spec(default)["containers"][0]["args"][0].strip() == "exec finalckpt gc --grace 600"
    assert render().config()["AIRFLOW__FINALCKPT__RETENTION_DAYS"] == "7"


def test_gc_disabled_by_default(render: Render) -> None:
    assert not render().all("CronJob")


# --------------------------------------------------------------------------- settings, NOTES


def test_settings_and_job_pod_options(render: Render) -> None:
    rendered = render(SCENARIOS["settings-and-jobs"])
    config = rendered.config()
    assert config["AIRFLOW__FINALCKPT__CHECKPOINT_INTERVAL_S"] == "30"
    assert config["AIRFLOW__FINALCKPT__RETAIN_CHECKPOINTS"] == "5"
    assert config["AIRFLOW__FINALCKPT__SOME_FUTURE_KEY"] == "x"
    spec = pod_spec(rendered.one("Job"))
    assert spec["containers"][0]["image"] == "registry.example.com/airflow-finalckpt:0.1.0-rc1"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["nodeSelector"] == {"pool": "batch"}
    assert spec["serviceAccountName"] == "finalckpt-jobs"
    assert "https://airflow.example.com/finalckpt/ui/runs" in rendered.notes
    assert rendered.official_values()["images"]["airflow"] == {
        "repository": "registry.example.com/airflow-finalckpt",
        "tag": "0.1.0-rc1",
    }


def test_rendered_settings_are_accepted_by_the_plugin(
    render: Render, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every AIRFLOW__FINALCKPT__* the chart renders is a setting the plugin knows, and the
    plugin's own parsers accept the rendered value (store URL included)."""
    from sqlalchemy.engine import make_url

    from airflow_finalckpt.config import PARSERS, env_var_name, resolve_setting
    from airflow_finalckpt.provider_info import API_CLIENT_OPTIONS

    cli_only = {env_var_name(name) for name in API_CLIENT_OPTIONS}  # test_chart_api_client.py
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_PASSWORD", "from the Secret")
    for scenario in ("defaults", "object-store", "airflow-postgres-custom"):
        rendered = render(SCENARIOS[scenario])
        env = {
            k: v
            for k, v in rendered.config().items()
            if k.startswith("AIRFLOW__FINALCKPT__") and k not in cli_only
        }
        names = {k.removeprefix("AIRFLOW__FINALCKPT__").lower() for k in env}
        assert names <= set(PARSERS), (scenario, names - set(PARSERS))
        for name in PARSERS:
            monkeypatch.delenv(env_var_name(name), raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        for name in names:
            value, source = resolve_setting(name)
            assert source == f"env {env_var_name(name)}", (scenario, name, source)
            if name == "store_url":  # the URL of the ConfigMap + the password of the Secret
                assert value.startswith("postgresql+psycopg://"), scenario
                assert make_url(value).password == "from the Secret", scenario
            if name == "storage_uri":
                assert value == env["AIRFLOW__FINALCKPT__STORAGE_URI"], scenario


def test_notes_tell_how_to_open_the_pipeline_page_and_stop(render: Render) -> None:
    notes = render().notes
    assert "kubectl -n airflow port-forward svc/airflow-api-server 8080:8080" in notes
    assert "http://localhost:8080/finalckpt/ui/runs" in notes
    assert '"Pipelines"' in notes
    assert "finalckpt stop DAG_ID RUN_ID --savepoint --wait" in notes
    assert "finalckpt resume DAG_ID RUN_ID" in notes
    assert "finalckpt restore DAG_ID --from SAVEPOINT_PATH" in notes
    assert "/finalckpt/api/" in notes


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_official_chart_values_reference_what_this_chart_provides(
    render: Render, scenario: str
) -> None:
    """NOTES' values for the official chart name the ConfigMaps/Secrets/PVC rendered here (or
    the existing ones the values name), and mount every volume they declare."""
    rendered = render(SCENARIOS[scenario])
    official = rendered.official_values()
    assert set(official) == {"images", "extraEnvFrom", "secret", "volumes", "volumeMounts"}
    env_from = yaml.safe_load(official["extraEnvFrom"])  # a templated string in that chart
    assert env_from == [{"configMapRef": {"name": f"{RELEASE}-config"}}]
    assert rendered.has("ConfigMap", f"{RELEASE}-config")
    secrets = {
        s["envName"]: ("secret", s["secretName"], s["secretKey"]) for s in official["secret"]
    }
    assert not rendered.all("Secret")  # every Secret named is one the user made
    if SCENARIOS[scenario]["coordinationDb"].get("mode") == "external":
        assert secrets["AIRFLOW__FINALCKPT__STORE_URL"][1] == "finalckpt-db"
    else:
        assert secrets["AIRFLOW__FINALCKPT__STORE_PASSWORD"][0] == "secret"
        assert rendered.config()["AIRFLOW__FINALCKPT__STORE_URL"].startswith("postgresql")
    if rendered.all("Job"):  # the migration Job gets the store's credential only: the
        # administrative one (airflowPostgres), which the Airflow pods never get
        job_env = container_env(pod_spec(rendered.one("Job"))["containers"][0])
        job_secrets = {k: v for k, v in job_env.items() if isinstance(v, tuple)}
        external = SCENARIOS[scenario]["coordinationDb"].get("mode") == "external"
        store_env = "AIRFLOW__FINALCKPT__STORE_" + ("URL" if external else "PASSWORD")
        assert set(job_secrets) == {store_env}
        if external:
            assert job_secrets[store_env] == secrets[store_env]
        else:
            assert job_secrets[store_env] not in secrets.values()
    volumes = {v["name"]: v for v in official["volumes"]}
    assert {m["name"] for m in official["volumeMounts"]} == set(volumes)
    assert rendered.has("ConfigMap", volumes["finalckpt-spark-conf"]["configMap"]["name"])
    claim = volumes.get("finalckpt-checkpoints", {}).get("persistentVolumeClaim", {})
    if claim and not SCENARIOS[scenario].get("checkpointStorage", {}).get("pvc", {}).get(
        "existingClaim"
    ):
        assert rendered.has("PersistentVolumeClaim", claim["claimName"])


def test_operations_guide_shows_the_rendered_official_chart_values(render: Render) -> None:
    """docs/operations.md's example of the values to merge is what the chart prints."""
    from chart_helpers import REPO

    guide = (REPO / "docs" / "operations.md").read_text()
    start = guide.index("For the defaults\nit is:")
    block = guide[guide.index("```yaml\n", start) + len("```yaml\n") : guide.index("```\n", start)]
    documented = yaml.safe_load(block)
    rendered = render(
        {"image": {"repository": "registry.example.com/airflow-finalckpt", "tag": "0.1.0"}}
    ).official_values()
    assert documented == rendered
    for command in (
        "helm install finalckpt ./helm/airflow-finalckpt",
        "finalckpt stop nycflights13_pipeline RUN_ID --savepoint --wait",
        "finalckpt resume nycflights13_pipeline RUN_ID",
        "finalckpt restore DAG_ID --from SAVEPOINT_PATH",
        "finalckpt gc --pipeline KEY --dry-run",
    ):
        assert command in guide, command
