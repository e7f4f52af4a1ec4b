"""Every credential a stage task handles is registered with Airflow's secrets masker.

Airflow masks connection passwords it hands out itself; the store URL may also come from
``AIRFLOW__FINALCKPT__STORE_URL`` or airflow.cfg, sink URLs and storage options from the DAG
file, and the URL a sink builds from its Airflow connection (``conn_id``) is new text too.
Registering them with ``airflow.sdk.log.mask_secret`` (task process and supervisor) replaces
them by ``***`` in the task log, whatever prints them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_finalckpt.config import FinalCkptSettings, airflow_option, is_secret_name
from airflow_finalckpt.core.errors import ConfigurationError


def url_secrets(url: str) -> list[str]:
    """A URL's password and credential query values, and the whole URL if it holds one."""
    found: list[str] = []
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.password:
            found.append(str(parsed.password))
        for name, value in parsed.query.items():
            values = [value] if isinstance(value, str) else list(value)
            if is_secret_name(name):
                found.extend(v for v in values if v)
    except Exception:
        pass
    return [url, *found] if found else []


def option_secrets(options: Mapping[str, Any]) -> list[str]:
    """The credential values of storage options or catalog properties (recursively)."""
    found: list[str] = []
    for key, value in options.items():
        if isinstance(value, Mapping):
            found.extend(option_secrets(value))
        elif isinstance(value, str) and value:
            found.extend([value] if is_secret_name(str(key)) else url_secrets(value))
    return found


def sink_secrets(sink: Any) -> list[str]:
    """The credentials a sink holds: its database URL, storage options, catalog properties."""
    found: list[str] = []
    try:
        engine = getattr(sink, "engine", None)
    except ConfigurationError:  # a conn_id sink not bound yet: nothing resolved to mask
        engine = None
    if engine is not None:
        found.extend(url_secrets(engine.url.render_as_string(hide_password=False)))
    for attr in ("storage_options", "catalog_config", "_properties"):
        value = getattr(sink, attr, None)
        if isinstance(value, Mapping):
            found.extend(option_secrets(value))
        elif isinstance(value, str):
            found.extend(url_secrets(value))
    for attr in ("bound_connection", "bound_storage_connection"):  # connections it resolved
        fields = getattr(sink, attr, None)
        if fields is not None:
            found.extend([fields.password] if fields.password else [])
            found.extend(option_secrets(fields.extra))
    return found


def mask_task_secrets(settings: FinalCkptSettings | None, sinks: Iterable[Any] = ()) -> int:
    """Register the store URL, storage options and sinks' credentials with Airflow's masker;
    returns how many values were registered.
    """
    from airflow.sdk.log import mask_secret

    values: list[str] = []
    if settings is not None:
        values.extend(url_secrets(settings.store_url))
        values.extend(option_secrets(settings.storage_options))
    for sink in sinks:
        values.extend(sink_secrets(sink))
    # Airflow skips (with a warning) secrets under 5 characters: they would mask too much
    unique = list(dict.fromkeys(v for v in values if len(v) >= 5))
    for value in unique:
        mask_secret(value)
    return len(unique)


def code_signing_key() -> str | None:
    """``[finalckpt] code_signing_key`` (env, airflow.cfg, ``_secret`` / ``_cmd``), masked in
    the task log; None when unset (``code.pkl`` and ``spec.json`` are then sealed with the
    random key the deployment generated in its store, see ``store.deployment_secrets``).
    """
    value, _source = airflow_option("finalckpt", "code_signing_key")
    if value:
        from airflow.sdk.log import mask_secret

        mask_secret(value)
    return value
