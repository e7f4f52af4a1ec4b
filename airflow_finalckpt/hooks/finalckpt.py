"""The hook tasks use to reach the coordination store and the checkpoint storage.

Settings are resolved in the order ``airflow_finalckpt.config`` documents, with one addition:
the Airflow connection (``finalckpt_default`` unless told otherwise) is looked up through the
Task SDK, so it may live in any secrets backend or in Airflow's connection list, not only in
``AIRFLOW_CONN_FINALCKPT_DEFAULT``:

1. a connection id other than the default names the store explicitly: it must exist and wins;
2. ``AIRFLOW__FINALCKPT__STORE_URL`` (as in ``load_settings``: an explicit setting beats the
   default connection, so the hook and the ``finalckpt`` CLI always agree on the store);
3. the connection ``finalckpt_default``, if the Task SDK finds it;
4. everything else as ``load_settings()`` resolves it (airflow.cfg ``[finalckpt]``, defaults).

The hook never touches Airflow's metadata database: inside a task the Task SDK asks the API
server for the connection; elsewhere only env variables and configured secrets backends are read.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_finalckpt import metrics
from airflow_finalckpt.config import (
    CONNECTION_ID,
    FinalCkptSettings,
    env_var_name,
    load_settings,
    mask_url,
    resolve_setting,
)
from airflow_finalckpt.connections.database import database_url
from airflow_finalckpt.connections.fields import ConnectionFields
from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.hooks.masking import mask_task_secrets
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.connect import RetryCallback, open_store

if TYPE_CHECKING:
    from sqlalchemy import Engine

DEFAULT_CONN_ID = CONNECTION_ID

# Every Airflow process that drives pipelines (workers, the triggerer) imports this hook: its
# coordinators' checkpoint events go to Airflow's metrics from here on.
metrics.install()

_ENGINES: dict[tuple[int, str], Engine] = {}
_ENGINES_LOCK = threading.Lock()


def shared_engine(
    store_url: str,
    *,
    retries: int | None = None,
    backoff_s: float | None = None,
    on_retry: RetryCallback | None = None,
) -> Engine:
    """One engine per store URL and process, its schema checked once (``open_store``: a SQLite
    store is brought to head, a PostgreSQL one must be there already: `finalckpt db upgrade`).

    The first call of a process connects with bounded retries and exponential back-off
    (``retries`` / ``backoff_s``, default: the ``store_connect_retries`` /
    ``store_connect_backoff_s`` settings) and raises StoreUnreachableError (a
    ConfigurationError naming the masked URL and the attempts) if the database never answers.
    Keyed by pid too: an engine (and its pool) must never be shared across a fork. An engine
    whose schema check failed is not cached, so the next call retries. The lock is not held
    while connecting: a store that is down does not block callers of other stores.
    """
    key = (os.getpid(), store_url)
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
    if engine is not None:
        return engine
    if retries is None:
        retries = int(resolve_setting("store_connect_retries")[0])
    if backoff_s is None:
        backoff_s = float(resolve_setting("store_connect_backoff_s")[0])
    engine = open_store(store_url, retries=retries, backoff_s=backoff_s, on_retry=on_retry)
    with _ENGINES_LOCK:
        cached = _ENGINES.setdefault(key, engine)
    if cached is not engine:  # another thread was faster
        engine.dispose()
    return cached


def dispose_engines() -> None:
    """Dispose of every cached engine of this process (tests, shutdown)."""
    with _ENGINES_LOCK:
        engines = [e for (pid, _), e in _ENGINES.items() if pid == os.getpid()]
        _ENGINES.clear()
    for engine in engines:
        engine.dispose()


def store_url_from_airflow_connection(conn: Any) -> str:
    """The SQLAlchemy URL of a Task SDK ``Connection`` (postgres or sqlite type), through the
    one conversion the package has (``connections.database``).

    Raises ValueError naming the problem (never the password).
    """
    return database_url(ConnectionFields.of(conn))


class FinalCkptHook(BaseHook):
    """Coordination store, coordinators and checkpoint storage for airflow-finalckpt.

    :param finalckpt_conn_id: Airflow connection holding the coordination store (a ``postgres``
        or ``sqlite`` connection). The default connection is optional; any other id must exist.
    """

    conn_name_attr = "finalckpt_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    hook_name = "airflow-finalckpt coordination store"

    def __init__(self, finalckpt_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.finalckpt_conn_id = finalckpt_conn_id
        self._settings: FinalCkptSettings | None = None

    # ------------------------------------------------------------------ settings

    def get_settings(self) -> FinalCkptSettings:
        """The resolved settings (see the module docstring), cached on the hook."""
        if self._settings is None:
            self._settings = self._resolve_settings()
            mask_task_secrets(self._settings)  # whatever source the store URL came from
            self.log.info(
                "finalckpt coordination store %s (%s)",
                self._settings.masked_store_url(),
                self._settings.sources.get("store_url", "unknown source"),
            )
        return self._settings

    def _resolve_settings(self) -> FinalCkptSettings:
        explicit = self.finalckpt_conn_id != DEFAULT_CONN_ID
        if not explicit and os.environ.get(env_var_name("store_url"), "").strip():
            return load_settings()
        conn = self._find_connection()
        if conn is None:
            if explicit:
                raise ConfigurationError(
                    f"Airflow connection {self.finalckpt_conn_id!r} is not defined; create it "
                    "(type postgres or sqlite) or leave finalckpt_conn_id at its default"
                )
            return load_settings()
        try:
            url = store_url_from_airflow_connection(conn)
        except ValueError as exc:
            raise ConfigurationError(
                f"Airflow connection {self.finalckpt_conn_id!r} cannot hold the coordination "
                f"store: {exc}"
            ) from exc
        settings = load_settings({"store_url": url})
        sources = dict(settings.sources)
        sources["store_url"] = f"Airflow connection {self.finalckpt_conn_id}"
        return dataclasses.replace(settings, sources=sources)

    def _find_connection(self) -> Any | None:
        try:
            return self.get_connection(self.finalckpt_conn_id)
        except AirflowNotFoundException:
            return None

    # ------------------------------------------------------------------ resources

    def get_engine(self) -> Engine:
        """The engine of the coordination store (cached per URL, schema checked once).

        An unreachable store is retried with back-off (``store_connect_retries``,
        ``store_connect_backoff_s``), then StoreUnreachableError; nothing is created meanwhile.
        """
        settings = self.get_settings()
        url = settings.store_url
        try:
            return shared_engine(
                url,
                retries=settings.store_connect_retries,
                backoff_s=settings.store_connect_backoff_s,
            )
        except ConfigurationError:
            raise
        except Exception as exc:
            raise ConfigurationError(
                f"cannot open the coordination store {mask_url(url)}: {exc}"
            ) from exc

    def get_coordinator(self, pipeline_key: str) -> Coordinator:
        """A coordinator of ``pipeline_key`` that writes completed checkpoints to storage."""
        return Coordinator(self.get_engine(), pipeline_key, writer=self.get_storage())

    def get_storage(self) -> CheckpointStorage:
        """The checkpoint storage of the resolved settings."""
        settings = self.get_settings()
        return CheckpointStorage(settings.storage_uri, settings.storage_options)

    def get_conn(self) -> Engine:
        """BaseHook's generic accessor: the coordination store engine."""
        return self.get_engine()
