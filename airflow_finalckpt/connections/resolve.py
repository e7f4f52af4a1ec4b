"""A connection id to its fields and storage options, where settings and sinks are resolved.

Where Airflow is installed (the task, the triggerer, the CLI next to Airflow) through the Task
SDK's ``BaseHook.get_connection``: any secrets backend, ``AIRFLOW_CONN_*``, and inside a task
the API server. Elsewhere (a CLI on a bare machine) ``AIRFLOW_CONN_<ID>`` only. An ``aws``
connection goes through apache-airflow-providers-amazon's ``AwsBaseHook.get_credentials`` where
that provider is installed, so a profile, an assumed role or web identity resolve to (temporary)
keys; without it the connection's own fields are the keys (``storage``'s generic mapping).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_finalckpt.connections.fields import ConnectionFields, connection_env_name
from airflow_finalckpt.connections.storage import Flavor, storage_kind, storage_options
from airflow_finalckpt.core.errors import ConfigurationError

log = logging.getLogger(__name__)


def resolve_connection(conn_id: str) -> ConnectionFields | None:
    """The connection's fields; None when it is not defined."""
    try:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError:
        return ConnectionFields.from_env(conn_id)
    try:
        return ConnectionFields.of(BaseHook.get_connection(conn_id))
    except AirflowNotFoundException:
        return None


def resolve_storage_connection(conn_id: str, who: str) -> ConnectionFields:
    """The connection's fields with a provider's resolved credentials; a missing connection is
    a ConfigurationError naming it and ``who`` uses it.
    """
    fields = resolve_connection(conn_id)
    if fields is None:
        raise ConfigurationError(
            f"{who}: Airflow connection {conn_id!r} (storage_conn_id) is not defined; create it "
            f"(e.g. {connection_env_name(conn_id)}, a secrets backend or the UI) or pass "
            "storage_options directly"
        )
    return with_provider_credentials(fields, who)


def resolve_storage_options(conn_id: str, who: str, flavor: Flavor) -> dict[str, Any]:
    """``storage.storage_options`` of the resolved connection."""
    return storage_options(resolve_storage_connection(conn_id, who), flavor, who)


def with_provider_credentials(fields: ConnectionFields, who: str) -> ConnectionFields:
    """An ``aws`` connection's keys as the amazon provider's hook resolves them (profiles,
    roles, web identity); any other connection, or without the provider, unchanged.
    """
    if storage_kind(fields) != "aws":
        return fields
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import (  # type: ignore[import-not-found, unused-ignore]
            AwsBaseHook,
        )
    except ImportError:
        return fields
    try:
        hook = AwsBaseHook(aws_conn_id=fields.conn_id, client_type="s3")
        region = hook.conn_region_name
        credentials = hook.get_credentials(region_name=region)
        endpoint = hook.conn_config.endpoint_url
    except Exception as exc:  # botocore's errors name the profile or role, not the secret
        raise ConfigurationError(
            f"{who}: Airflow connection {fields.conn_id!r}: the amazon provider's AwsBaseHook "
            f"could not resolve its credentials: {type(exc).__name__}: {exc}"
        ) from None
    log.debug("connection %s: credentials resolved by AwsBaseHook", fields.conn_id)
    extra = {k: v for k, v in fields.extra.items() if k != "aws_session_token"}
    extra.update(region_name=region, endpoint_url=endpoint)
    if credentials.token:
        extra["aws_session_token"] = credentials.token
    return fields.replace(
        login=credentials.access_key, password=credentials.secret_key, extra=extra
    )
