"""A sink's ``storage_conn_id``: the object store's credentials from an Airflow connection.

Shared by the file sinks (Parquet, and Delta and Iceberg through ``staged``). The sink keeps
three layers of options, merged in this order (later wins): the connection's (rendered for
fsspec, ``connections.storage``), a catalog connection's extra ``storage_options`` (Iceberg),
and the DAG's own ``storage_options``. Only the DAG's are pickled: a submitted driver binds the
connection again from its secrets file.
"""

from __future__ import annotations

from typing import Any

from airflow_finalckpt.connections.fields import ConnectionFields
from airflow_finalckpt.connections.storage import storage_options
from airflow_finalckpt.core.errors import ConfigurationError


class StorageConnectionMixin:
    """``storage_conn_id`` / ``bind_storage_connection`` (see ``sinks.connections.SLOTS``)."""

    sink_id: str
    storage_options: dict[str, Any]

    def _init_storage(self, given: dict[str, Any] | None, storage_conn_id: str | None) -> None:
        #: what the DAG gave (pickled); the connections' options go under it
        self._declared_storage_options = dict(given or {})
        #: the Airflow connection the object store's credentials come from (task side)
        self.storage_conn_id = storage_conn_id
        self.bound_storage_connection: ConnectionFields | None = None
        self._connection_storage_options: dict[str, Any] = {}
        self._catalog_storage_options: dict[str, Any] = {}
        self.storage_options = dict(self._declared_storage_options)

    def bind_storage_connection(self, fields: ConnectionFields) -> None:
        """The credentials of the resolved ``storage_conn_id`` connection (as its provider's
        hook resolved them on the task side), under the sink's own options.
        """
        who = f"sink {self.sink_id!r}"
        self._connection_storage_options = storage_options(fields, "fsspec", who)
        self.bound_storage_connection = fields
        self._merge_storage_options()
        self._bind_storage_flavor(fields, who)

    def _bind_storage_flavor(self, fields: ConnectionFields, who: str) -> None:
        """The table library's own spelling of the credentials (deltalake, pyiceberg)."""

    def _merge_storage_options(self) -> None:
        self.storage_options = {
            **self._connection_storage_options,
            **self._catalog_storage_options,
            **self._declared_storage_options,
        }
        self._storage_options_changed()

    def _storage_options_changed(self) -> None:
        """Drop what was opened with the old options."""

    def _check_storage_bound(self) -> None:
        require_bound(self.sink_id, self.storage_conn_id, self.bound_storage_connection is not None)


def require_bound(sink_id: str, conn_id: str | None, bound: bool) -> None:
    """A sink naming a connection must have it bound (resolved on the task side) before use."""
    if conn_id and not bound:
        raise ConfigurationError(
            f"sink {sink_id!r}: Airflow connection {conn_id!r} is resolved when the stage task "
            "runs; bind it first (hooks.sink_connections)"
        )
