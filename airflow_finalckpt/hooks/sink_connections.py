"""The Airflow task resolves the connections its sinks name (``conn_id`` / ``catalog_conn_id``
/ ``storage_conn_id``).

Through the Task SDK's ``BaseHook.get_connection``: inside a task it asks the API server (any
secrets backend, ``AIRFLOW_CONN_*``, Airflow's connection list), never the metadata database.
Called when the task runs (``execute``, ``execute_complete``), never when the DAG is parsed, so
the DAG processor and the serialized DAG see connection ids only. What a sink resolves is
registered with the secrets masker at once, before anything can log it. A storage connection
goes through its provider's hook where one is installed (``connections.resolve``): what the
sink binds, and a submitted driver gets, are the resolved keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_finalckpt.connections.resolve import with_provider_credentials
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.hooks.masking import mask_task_secrets
from airflow_finalckpt.sinks.connections import ConnectionFields, unbound_slots


def bind_sink_connections(sinks: Iterable[Any], log: Any = None) -> int:
    """Resolve and bind every sink's Airflow connection not bound yet; returns how many.

    A connection that does not exist is a ``ConfigurationError`` naming it and the sink.
    """
    bound = 0
    for sink in sinks:
        for role, conn_id, bind in list(unbound_slots(sink)):
            try:
                conn = BaseHook.get_connection(conn_id)
            except AirflowNotFoundException:
                raise ConfigurationError(
                    f"sink {sink.sink_id!r}: Airflow connection {conn_id!r} is not defined; "
                    f"create it (e.g. AIRFLOW_CONN_{conn_id.upper()}, a secrets backend or the "
                    "UI) or pass the sink's URL / catalog / storage_options directly"
                ) from None
            fields = ConnectionFields.of(conn)
            mask_task_secrets(None, [_Resolved(fields)])  # the password, before any use
            if role == "storage":
                fields = with_provider_credentials(fields, f"sink {sink.sink_id!r}")
                mask_task_secrets(None, [_Resolved(fields)])  # a provider's temporary keys
            getattr(sink, bind)(fields)
            mask_task_secrets(None, [sink])  # and the URL / options the sink built from it
            bound += 1
            if log is not None:
                log.info("sink %s: connection %s resolved", sink.sink_id, conn_id)
    return bound


class _Resolved:
    """A resolved connection seen as a sink by ``mask_task_secrets``."""

    def __init__(self, fields: ConnectionFields) -> None:
        self.bound_connection = fields
