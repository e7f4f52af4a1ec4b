"""What Airflow's ProvidersManager learns about airflow-finalckpt (``apache_airflow_provider``).

``get_provider_info()`` follows Airflow's ``provider_info.schema.json``. Airflow reads it in every
component once providers are discovered: ``airflow providers list`` / ``get airflow-finalckpt``
show the package, ``airflow config list --section finalckpt`` shows the ``[finalckpt]`` section
with the defaults below, ``@task.finalckpt_stage`` is the stage decorator and the "Pipeline"
extra link deserializes without the plugin.

``CONFIG_OPTIONS`` is the one table of the ``[finalckpt]`` options: ``config.py`` takes its
defaults from it too, so Airflow's config and the Airflow-free path (the Spark driver, the CLI
without Airflow) agree. Defaults are ``str.format`` templates as in Airflow's own config.yml:
``{AIRFLOW_HOME}`` is expanded, literal braces are doubled.

No connection type is declared: the coordination store is an ordinary ``postgres`` or ``sqlite``
connection (``finalckpt_default`` unless a stage names another), see ``hooks/finalckpt.py``.

Stdlib only: Airflow imports this module while it discovers providers, in every process.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

PACKAGE_NAME = "airflow-finalckpt"
SECTION = "finalckpt"
#: First package version of every option below (Airflow's ``version_added``).
FIRST_VERSION = "0.1.0"


def _option(
    description: str,
    kind: str,
    default: str | None,
    example: str | None,
    *,
    sensitive: bool = False,
) -> dict[str, Any]:
    """One option in the shape of Airflow's ``config.yml`` (provider_info ``config`` schema);
    a ``sensitive`` one is masked by Airflow and may come from ``_CMD`` / ``_SECRET``.
    """
    option: dict[str, Any] = {
        "description": description,
        "version_added": FIRST_VERSION,
        "type": kind,
        "example": example,
        "default": default,
    }
    if sensitive:
        option["sensitive"] = True
    return option


#: The ``[finalckpt]`` options: description, type, default (a template) and example.
CONFIG_OPTIONS: dict[str, dict[str, Any]] = {
    "store_url": _option(
        "SQLAlchemy URL of the coordination store: postgresql+psycopg:// (clusters) or an "
        "absolute sqlite:////path.db. AIRFLOW__FINALCKPT__STORE_URL wins over the Airflow "
        "connection finalckpt_default, which wins over this option; keep passwords in that "
        "connection (any secrets backend).",
        "string",
        "sqlite:///{AIRFLOW_HOME}/finalckpt/coordination.db",
        "postgresql+psycopg://finalckpt@postgres:5432/finalckpt",
        sensitive=True,
    ),
    "store_password": _option(
        "Password of the store_url's user when that PostgreSQL URL carries none: the Helm "
        "chart renders the URL without credentials and gives this from an existing Kubernetes "
        "Secret (AIRFLOW__FINALCKPT__STORE_PASSWORD); elsewhere use store_password_secret / "
        "_cmd or a secrets backend.",
        "string",
        None,
        None,
        sensitive=True,
    ),
    "storage_uri": _option(
        "Root of the checkpoint storage: an fsspec URI or an absolute local path every worker "
        "(and Spark driver) sees.",
        "string",
        "{AIRFLOW_HOME}/finalckpt/checkpoints",
        "s3a://bucket/finalckpt",
    ),
    "storage_options": _option(
        "fsspec storage options of storage_uri, a JSON object (credentials are masked in logs; "
        "not marked sensitive: Airflow would warn about masking its 2-character default).",
        "string",
        "{{}}",
        '{"anon": false}',
    ),
    "storage_conn_id": _option(
        "An Airflow connection giving storage_uri's credentials (aws, google_cloud_platform, "
        "wasb, or any type whose extra holds fsspec storage_options), resolved where the "
        "settings are (tasks, triggerer, CLI), through the amazon provider's AwsBaseHook when "
        "installed; storage_options apply over it. Empty: none.",
        "string",
        "",
        "aws_checkpoints",
    ),
    "checkpoint_interval_s": _option(
        "Seconds between periodic checkpoints of a running pipeline.",
        "float",
        "60",
        "30",
    ),
    "checkpoint_timeout_s": _option(
        "Seconds after which a checkpoint that not every stage acknowledged is aborted.",
        "float",
        "600",
        "900",
    ),
    "retain_checkpoints": _option(
        "Complete checkpoints kept per pipeline (at least 1; savepoints are always kept).",
        "integer",
        "3",
        "5",
    ),
    "store_connect_retries": _option(
        "Retries when the coordination store is unreachable as a task or the triggerer starts "
        "(0: fail at the first attempt).",
        "integer",
        "5",
        "10",
    ),
    "store_connect_backoff_s": _option(
        "First wait in seconds between store connect attempts; doubles, at most 30 s "
        "(default: waits 1+2+4+8+16 s).",
        "float",
        "1.0",
        "0.5",
    ),
    "target_batch_s": _option(
        "Target duration in seconds of an auto split batch (a stage's target_batch_s wins).",
        "float",
        "30.0",
        "60",
    ),
    "retention_days": _option(
        "Days a closed pipeline (every stage closed) is kept after its last change; then "
        "`finalckpt gc` removes its checkpoints, intermediate outputs, state and store rows "
        "(savepoints only with --savepoints). 0: at the next gc.",
        "float",
        "7",
        "30",
    ),
    "attempt_lease_s": _option(
        "Seconds a running stage attempt stays alive without renewing its lease (it renews "
        "every third of it); a SIGKILLed attempt stops blocking checkpoints after it.",
        "float",
        "60",
        "30",
    ),
    # the `finalckpt` CLI's way to Airflow's REST API (finalckpt restore); no defaults
    "api_url": _option(
        "Base URL of the Airflow api-server the finalckpt CLI talks to (restore: the DAG's "
        "graph, new DAG runs). Unset: [api] base_url, else http://localhost:8080.",
        "string",
        None,
        "https://airflow.example.com",
    ),
    "api_token": _option(
        "Bearer token (JWT) the finalckpt CLI sends to the Airflow API, e.g. from POST "
        "/auth/token. Unset: api_username and api_password get one.",
        "string",
        None,
        None,
        sensitive=True,
    ),
    "api_username": _option(
        "Airflow user the finalckpt CLI logs in as (POST /auth/token) when no api_token is set.",
        "string",
        None,
        "admin",
    ),
    "api_password": _option(
        "Password of api_username (use AIRFLOW__FINALCKPT__API_PASSWORD_CMD / _SECRET or a "
        "secrets backend rather than airflow.cfg).",
        "string",
        None,
        None,
        sensitive=True,
    ),
    "code_signing_key": _option(
        "Key that seals (encrypts and signs) the job spec and the stage code a submitted Spark "
        "driver runs (spec.json, code.pkl); the driver refuses a file sealed with another key "
        "before importing or unpickling anything. Unset: a random key the deployment generates "
        "once and keeps in its coordination store (never derived from anything guessable). Set "
        "it from a secret (AIRFLOW__FINALCKPT__CODE_SIGNING_KEY_SECRET, a secrets backend, the "
        "Helm chart's codeSigningKey.existingSecret) to give Kubernetes cluster-mode drivers "
        "the key through a Secret.",
        "string",
        None,
        None,
        sensitive=True,
    ),
    "auto_migrate": _option(
        "Whether Airflow components (tasks, triggerer, api-server, DAG processor) bring the "
        "store's schema to this package's revision themselves. Unset: true for a SQLite store, "
        "false for PostgreSQL, whose schema only `finalckpt db upgrade` (the Helm chart's "
        "migration Job) changes; a process then refuses an older schema, naming that command. "
        "Spark drivers never migrate a PostgreSQL store.",
        "boolean",
        None,
        "false",
    ),
    "trust_forwarded_host": _option(
        "Whether the plugin's CSRF origin check takes a request's X-Forwarded-Host as the "
        "Airflow UI's host. Unset: false, any client can send that header; the UI's host is "
        "the request's own and that of [api] base_url (set it when a proxy serves the UI). "
        "Set true only behind a proxy that overwrites X-Forwarded-Host on every request.",
        "boolean",
        None,
        "true",
    ),
    "spark_execution": _option(
        "How stage tasks run Spark when neither the operator nor the Spark connection's "
        "finalckpt-execution extra says: in-process, submit or connect. Unset: automatic "
        "(sc:// -> connect, a connection with a deploy-mode extra -> submit, else in-process).",
        "string",
        None,
        "submit",
    ),
}

#: Options only the ``finalckpt`` CLI reads (``cli/airflow_api.py``), all without defaults.
API_CLIENT_OPTIONS = ("api_url", "api_token", "api_username", "api_password")

#: Settings of ``config.py``: every option with a default (spark_execution and the API
#: client's options have none).
SETTING_DEFAULTS: dict[str, str] = {
    name: option["default"]
    for name, option in CONFIG_OPTIONS.items()
    if option["default"] is not None
}


def expand_default(template: str, airflow_home: str) -> str:
    """A default as Airflow expands it (``str.format`` with ``AIRFLOW_HOME``)."""
    return template.format(AIRFLOW_HOME=airflow_home)


def _package_version() -> str:
    try:
        return version(PACKAGE_NAME)
    except PackageNotFoundError:  # a source checkout on sys.path, not installed
        return FIRST_VERSION


def get_provider_info() -> dict[str, Any]:
    """The provider description Airflow validates against ``provider_info.schema.json``."""
    integration = "airflow-finalckpt"
    return {
        "package-name": PACKAGE_NAME,
        "name": "airflow-finalckpt",
        "description": "Flink-style final checkpoints (FLIP-147) for multi-stage PySpark "
        "pipelines: exactly-once two-phase-commit sinks, resume without rerunning finished "
        "stages, stop with drain or savepoint.",
        "versions": [_package_version()],
        "integrations": [{"integration-name": integration, "tags": ["software"]}],
        "operators": [
            {
                "integration-name": integration,
                "python-modules": ["airflow_finalckpt.operators.stage"],
            }
        ],
        "sensors": [
            {
                "integration-name": integration,
                "python-modules": ["airflow_finalckpt.sensors.final_checkpoint"],
            }
        ],
        "hooks": [
            {
                "integration-name": integration,
                "python-modules": ["airflow_finalckpt.hooks.finalckpt"],
            }
        ],
        "triggers": [
            {
                "integration-name": integration,
                "python-modules": ["airflow_finalckpt.triggers.final_checkpoint"],
            }
        ],
        "extra-links": ["airflow_finalckpt.plugins.links.PipelineLink"],
        "task-decorators": [
            {
                "name": "finalckpt_stage",
                "class-name": "airflow_finalckpt.decorators.stage.finalckpt_stage",
            }
        ],
        "config": {
            SECTION: {
                "description": "airflow-finalckpt: coordination store, checkpoint storage, "
                "checkpointing and Spark execution. Env: AIRFLOW__FINALCKPT__<OPTION>.",
                "options": CONFIG_OPTIONS,
            }
        },
    }
