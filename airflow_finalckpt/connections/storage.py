"""Object-store options from an Airflow connection: the documented generic mapping.

A connection names its store's credentials in Airflow's usual fields; each consumer spells them
its own way, so one connection renders three ways (``flavor``):

- ``fsspec`` (Parquet sinks, the staged files of Delta and Iceberg sinks, checkpoint storage):
  s3fs ``key`` / ``secret`` / ``token`` / ``endpoint_url`` / ``client_kwargs.region_name``;
  gcsfs ``token`` / ``project``; adlfs ``account_name`` / ``account_key`` / ``sas_token`` /
  ``connection_string`` / ``tenant_id`` / ``client_id`` / ``client_secret``;
- ``delta`` (deltalake's object store): ``aws_access_key_id``..., ``google_service_account``...,
  ``azure_storage_account_name``...;
- ``iceberg`` (pyiceberg FileIO properties): ``s3.access-key-id``..., ``adls.account-name``...

Connection types and fields (as Airflow's providers define them):

- ``aws``: login = access key id, password = secret access key, extra ``aws_session_token``,
  ``region_name``, ``endpoint_url``; with apache-airflow-providers-amazon installed the task
  resolves the connection through ``AwsBaseHook.get_credentials`` first (``resolve``), so
  profiles, assumed roles and web identity come down to keys here;
- ``google_cloud_platform``: extra ``keyfile_dict`` (the service account's JSON) or
  ``key_path``, and ``project`` (also with Airflow's ``extra__google_cloud_platform__`` prefix);
- ``wasb`` / ``adls``: login = account name, password = account key, extra ``sas_token``,
  ``connection_string``, ``account_name``; with extra ``tenant_id`` a service principal:
  login = client id, password = client secret;
- any type: extra ``storage_options``, a JSON object of fsspec options, applied over the above
  (``fsspec`` and ``delta``: the options a Delta sink gives both libraries).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from airflow_finalckpt.connections.fields import ConnectionFields
from airflow_finalckpt.core.errors import ConfigurationError

Flavor = Literal["fsspec", "delta", "iceberg"]

AWS_TYPES = frozenset({"aws"})
GOOGLE_TYPES = frozenset({"google_cloud_platform", "gcp"})
AZURE_TYPES = frozenset({"wasb", "adls", "azure_data_lake", "azure"})
GOOGLE_PREFIX = "extra__google_cloud_platform__"


def storage_kind(fields: ConnectionFields) -> str:
    """``aws``, ``google``, ``azure`` or ``generic`` (extra ``storage_options`` only)."""
    kind = fields.conn_type.strip().lower().replace("-", "_")
    if kind in AWS_TYPES:
        return "aws"
    if kind in GOOGLE_TYPES:
        return "google"
    if kind in AZURE_TYPES:
        return "azure"
    return "generic"


def extra_storage_options(fields: ConnectionFields, who: str) -> dict[str, Any]:
    """The fsspec options the connection's extra names (key ``storage_options``)."""
    options = fields.extra.get("storage_options") or {}
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError:
            options = None
    if not isinstance(options, Mapping):
        where = f"{who}: Airflow connection {fields.conn_id!r}"
        raise ConfigurationError(
            f"{where}: extra storage_options must be a JSON object of fsspec options"
        )
    return dict(options)


def storage_options(fields: ConnectionFields, flavor: Flavor, who: str) -> dict[str, Any]:
    """The connection's credentials in ``flavor``'s spelling (see the module docstring)."""
    kind = storage_kind(fields)
    if kind == "aws":
        options = _aws(fields, flavor)
    elif kind == "google":
        options = _google(fields, flavor, who)
    elif kind == "azure":
        options = _azure(fields, flavor)
    else:
        options = {}
    if flavor != "iceberg":
        options.update(extra_storage_options(fields, who))
    elif kind == "generic":
        extra_storage_options(fields, who)  # still refuse a malformed one
    return {k: v for k, v in options.items() if v not in (None, "", {})}


def _aws(fields: ConnectionFields, flavor: Flavor) -> dict[str, Any]:
    extra = fields.extra
    token = extra.get("aws_session_token")
    region = extra.get("region_name")
    endpoint = extra.get("endpoint_url") or extra.get("host")
    if flavor == "fsspec":
        return {
            "key": fields.login,
            "secret": fields.password,
            "token": token,
            "endpoint_url": endpoint,
            "client_kwargs": {"region_name": region} if region else {},
        }
    if flavor == "delta":
        options = {
            "aws_access_key_id": fields.login,
            "aws_secret_access_key": fields.password,
            "aws_session_token": token,
            "aws_region": region,
            "aws_endpoint_url": endpoint,
        }
        if str(endpoint or "").startswith("http://"):
            options["aws_allow_http"] = "true"
        return options
    return {
        "s3.access-key-id": fields.login,
        "s3.secret-access-key": fields.password,
        "s3.session-token": token,
        "s3.region": region,
        "s3.endpoint": endpoint,
    }


def _google_field(fields: ConnectionFields, name: str) -> Any:
    return fields.extra.get(name) or fields.extra.get(GOOGLE_PREFIX + name)


def _google(fields: ConnectionFields, flavor: Flavor, who: str) -> dict[str, Any]:
    keyfile = _google_field(fields, "keyfile_dict")
    if isinstance(keyfile, str) and keyfile.strip():
        try:
            keyfile = json.loads(keyfile)
        except json.JSONDecodeError:
            raise ConfigurationError(
                f"{who}: Airflow connection {fields.conn_id!r}: extra keyfile_dict is not "
                "valid JSON"
            ) from None
    key_path = _google_field(fields, "key_path")
    project = _google_field(fields, "project")
    if flavor == "fsspec":
        return {"token": keyfile or key_path, "project": project}
    if flavor == "delta":
        return {
            "google_service_account_key": json.dumps(keyfile) if keyfile else None,
            "google_service_account": key_path,
        }
    return {"gcs.project-id": project}  # pyiceberg's GCS FileIO: application default creds


def _azure(fields: ConnectionFields, flavor: Flavor) -> dict[str, Any]:
    extra = fields.extra
    principal = bool(extra.get("tenant_id"))
    values = {
        "account_name": extra.get("account_name") or (None if principal else fields.login),
        "account_key": None if principal else fields.password,
        "sas_token": extra.get("sas_token"),
        "connection_string": extra.get("connection_string"),
        "tenant_id": extra.get("tenant_id"),
        "client_id": fields.login if principal else None,
        "client_secret": fields.password if principal else None,
    }
    if flavor == "fsspec":
        return values
    if flavor == "delta":
        names = {
            "account_name": "azure_storage_account_name",
            "account_key": "azure_storage_account_key",
            "sas_token": "azure_storage_sas_key",
            "tenant_id": "azure_storage_tenant_id",
            "client_id": "azure_storage_client_id",
            "client_secret": "azure_storage_client_secret",
        }
    else:
        names = {k: "adls." + k.replace("_", "-") for k in values}
    return {names[k]: v for k, v in values.items() if k in names}
