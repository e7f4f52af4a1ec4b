"""An Apache Iceberg table: Spark stages Parquet data files, pyiceberg appends them in one snapshot.

- write: the table is created from the first batch if absent (every column optional); a table
  with another schema is refused before any file is written. Spark writes the files under
  ``<data location>/finalckpt/<sink_id>/<txn_id>/`` with the table's field ids and microsecond
  timestamps; no snapshot references them, so no reader sees them.
- precommit: the files are listed and sealed in a manifest beside them (see ``staged``).
- commit with ``replace_slice``: all the stage's transactions in ONE snapshot that also removes
  the slice's data files (an ``overwrite``; a file holding rows in and out of the slice is
  rewritten by pyiceberg's delete, in the same table commit), see ``staged_replace``.
- commit: ONE fast-append snapshot adds the files (metadata only: pyiceberg reads the Parquet
  footers for the column statistics, never the data), with ``finalckpt.txn-id`` in the snapshot
  summary and, in the same table commit, a table property ``finalckpt.committed.<sink_id>/<txn_id>``
  (dropped by a later commit once the transaction's committed marker exists). A replayed commit
  finds the id in the snapshot history or, after ``expire_snapshots`` removed that snapshot, in
  the property, and does nothing; a commit lost to another writer (concurrent runs) is retried
  on the new version, bounded (``commit_retry``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_finalckpt.connections.storage import extra_storage_options
from airflow_finalckpt.connections.storage import storage_options as connection_storage_options
from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.pyspark_compat import arrow_schema
from airflow_finalckpt.sinks.base import SinkError, check_slice
from airflow_finalckpt.sinks.commit_retry import CommitConflict, commit_retrying
from airflow_finalckpt.sinks.connections import (
    ConnectionFields,
    database_url,
    is_database,
)
from airflow_finalckpt.sinks.iceberg_tables import after_creation_races, schema_mismatch
from airflow_finalckpt.sinks.staged import (
    CHECKPOINT_ID_KEY,
    SINK_ID_KEY,
    TXN_ID_KEY,
    StagedTableSink,
    first_line,
    micros_timestamps,
    optional_schema,
)
from airflow_finalckpt.sinks.staged_replace import SLICE_KEY, TXN_IDS_KEY, txn_ids_of
from airflow_finalckpt.sinks.storage_connection import require_bound

if TYPE_CHECKING:
    import pyarrow
    import pyspark.sql
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table, Transaction

NAME_MAPPING_PROPERTY = "schema.name-mapping.default"
COMMIT_NUM_RETRIES = "commit.retry.num-retries"
#: Table property prefix of the commit records (``finalckpt.committed.<sink_id>/<txn_id>``).
COMMITTED_PROPERTY_PREFIX = "finalckpt.committed."
DATA_PATH_PROPERTY = "write.data.path"


class IcebergTableSink(StagedTableSink):
    """Two-phase-commit sink appending to the Iceberg table ``table`` (``namespace.name``).

    ``catalog``: None for pyiceberg's SQL catalog on ``<warehouse>/catalog.db`` (SQLite); a
    SQLAlchemy URL for a SQL catalog on that database; or pyiceberg catalog properties
    (``{"type": "rest", "uri": ...}``, Hive, Glue...). ``warehouse`` is where new tables go.

    :param sink_id: the sink's id, unique in the pipeline (it names its transactions).
    :param table: the Iceberg table, ``namespace.name`` (created by the first batch if absent).
    :param warehouse: where new tables' files go (and the default SQLite catalog's file).
    :param catalog: None, a SQLAlchemy URL of a SQL catalog, or pyiceberg catalog properties.
    :param catalog_name: the catalog's name (also in ``asset_uri``).
    :param storage_options: fsspec options of the tables' filesystem (the staged files).
    :param replace_slice: ``{column: value}``, the slice of the table one pipeline run owns
        (templated, e.g. ``{"event_date": "{{ ds }}"}``): the stage's commit replaces its rows
        atomically (needs ``commit_mode="final"``); None appends.
    :param catalog_conn_id: an Airflow connection giving the catalog instead of ``catalog``,
        resolved when the task runs: a ``postgres`` / ``sqlite`` connection is a SQL catalog in
        that database; any other type's extra holds the catalog properties (host: ``uri``,
        ``login:password``: ``credential``); the extra's ``storage_options`` add fsspec options.
    :param storage_conn_id: an Airflow connection (``aws``, ``google_cloud_platform``,
        ``wasb``, or any type whose extra holds fsspec ``storage_options``) giving the object
        store's credentials, resolved when the task runs: fsspec options of the staged files and
        pyiceberg FileIO properties, under ``storage_options`` and the catalog's own.
    """

    def __init__(
        self,
        sink_id: str,
        table: str,
        *,
        warehouse: str | None = None,
        catalog: str | Mapping[str, str] | None = None,
        catalog_name: str = "finalckpt",
        storage_options: dict[str, Any] | None = None,
        replace_slice: Mapping[str, Any] | None = None,
        catalog_conn_id: str | None = None,
        storage_conn_id: str | None = None,
    ) -> None:
        super().__init__(sink_id, storage_options, storage_conn_id)
        if catalog_conn_id is not None and catalog is not None:
            raise ConfigurationError(
                f"sink {sink_id!r}: pass either catalog= or catalog_conn_id= (an Airflow "
                "connection, resolved when the task runs), not both"
            )
        #: the Airflow connection the catalog comes from (resolved when the task runs)
        self.catalog_conn_id = catalog_conn_id
        self.bound_connection: ConnectionFields | None = None
        self._file_io_properties: dict[str, Any] = {}
        self.replace_slice = check_slice(sink_id, replace_slice)
        if table.count(".") < 1 or not all(table.split(".")):
            raise ConfigurationError(
                f"sink {sink_id!r}: argument table={table!r} must be 'namespace.name'"
            )
        self.table_name = table
        self.warehouse = warehouse
        self.catalog_config = catalog if isinstance(catalog, str | None) else dict(catalog)
        self.catalog_name = catalog_name
        self._properties: dict[str, Any] | None = None
        if catalog_conn_id is None:
            self._properties = self._catalog_properties()
        self._catalog_cache: Catalog | None = None
        self._root_cache: str | None = None

    def _catalog_properties(self) -> dict[str, str]:
        config = self.catalog_config
        if isinstance(config, dict):
            properties = dict(config)
        else:
            if config is None:
                if self.warehouse is None or "://" in self.warehouse.removeprefix("file://"):
                    raise ConfigurationError(
                        "IcebergTableSink needs a local warehouse for its default SQLite "
                        "catalog, or catalog= (a SQLAlchemy URL or catalog properties)"
                    )
                config = f"sqlite:///{self.warehouse.removeprefix('file://')}/catalog.db"
            properties = {"type": "sql", "uri": config}
        if self.warehouse is not None:
            properties.setdefault("warehouse", self.warehouse)
        return properties

    @property
    def connection_id(self) -> str | None:
        """The Airflow connection this sink's catalog comes from (``catalog_conn_id``)."""
        return self.catalog_conn_id

    def bind_connection(self, fields: ConnectionFields) -> None:
        """The catalog of the resolved connection: a SQL catalog in a ``postgres`` / ``sqlite``
        connection's database; for any other type the extra's pyiceberg catalog properties
        (the host is the ``uri``, ``login:password`` the ``credential`` unless the extra sets
        them). The extra's ``storage_options`` (fsspec) apply under the sink's own.
        """
        who = f"sink {self.sink_id!r}"
        options = extra_storage_options(fields, who)
        if is_database(fields):
            properties: dict[str, Any] = {"type": "sql", "uri": database_url(fields, who)}
        else:
            properties = {k: v for k, v in fields.extra.items() if k != "storage_options"}
            if fields.host:
                properties.setdefault("uri", fields.host)
            if fields.password:
                secret = f"{fields.login}:{fields.password}" if fields.login else fields.password
                properties.setdefault("credential", secret)
        if self.warehouse is not None:
            properties.setdefault("warehouse", self.warehouse)
        self._catalog_storage_options = options
        self._merge_storage_options()
        self._properties, self._catalog_cache = properties, None
        self.bound_connection = fields

    def _bind_storage_flavor(self, fields: ConnectionFields, who: str) -> None:
        """The FileIO of pyiceberg reads the data files' footers: the keys as its properties."""
        self._file_io_properties = connection_storage_options(fields, "iceberg", who)
        self._catalog_cache = None

    def _bound_properties(self) -> dict[str, Any]:
        require_bound(self.sink_id, self.catalog_conn_id, self._properties is not None)
        self._check_storage_bound()
        assert self._properties is not None
        return {**self._file_io_properties, **self._properties}

    def __reduce__(self) -> tuple[Any, ...]:
        """Picklable (shipped to a submitted Spark driver): rebuilt from its arguments; the
        catalog properties may hold credentials, so treat the pickle as a secret (a
        ``catalog_conn_id`` sink pickles the connection's id only, bound again on the driver).
        """
        return (_rebuild, (self.sink_id, self.table_name, self._arguments()))

    def _arguments(self) -> dict[str, Any]:
        return {
            "warehouse": self.warehouse,
            "catalog": self.catalog_config,
            "catalog_name": self.catalog_name,
            "storage_options": self._declared_storage_options,
            "replace_slice": self.replace_slice,
            "catalog_conn_id": self.catalog_conn_id,
            "storage_conn_id": self.storage_conn_id,
        }

    @property
    def asset_uri(self) -> str:
        """``iceberg://<catalog name>/<namespace>/<table>``."""
        namespace, name = self.table_name.rsplit(".", 1)
        return f"iceberg://{self.catalog_name}/{namespace.replace('.', '/')}/{name}"

    def _describe_catalog(self) -> str:
        properties = self._properties or {}
        kind = properties.get("type", "catalog")
        where = str(properties.get("uri", ""))
        if "@" in where:  # user:password@host
            where = where.split("://", 1)[0] + "://***@" + where.rsplit("@", 1)[1]
        return f"Iceberg {kind} catalog {where}".strip()

    def _catalog_error(self, doing: str, exc: Exception) -> SinkError:
        return SinkError(
            f"sink {self.sink_id!r}: {self._describe_catalog()} failed while {doing} table "
            f"{self.table_name!r}: {first_line(exc)} (nothing was committed; retry when fixed)"
        )

    def _catalog(self) -> Catalog:
        if self._catalog_cache is None:
            from pyiceberg.catalog import load_catalog

            properties = self._bound_properties()
            if properties.get("type") == "sql" and self.warehouse is not None:
                self._make_local_warehouse()
            try:  # a new SQL catalog's tables, created concurrently: the losers load them
                self._catalog_cache = after_creation_races(
                    lambda: load_catalog(self.catalog_name, **properties)
                )
            except Exception as exc:
                raise self._catalog_error("opening the catalog for", exc) from exc
        return self._catalog_cache

    def _make_local_warehouse(self) -> None:
        import os

        assert self.warehouse is not None
        if "://" not in self.warehouse.removeprefix("file://"):
            try:
                os.makedirs(self.warehouse.removeprefix("file://"), exist_ok=True)
            except OSError as exc:
                raise self._catalog_error("creating the warehouse of", exc) from exc

    def _load(self, create_from: pyarrow.Schema | None = None) -> Table | None:
        """The table, freshly loaded; created from ``create_from`` if absent (else None).
        Concurrent first runs race to create the namespace and the table: the losers load
        what the winner created.
        """
        from pyiceberg.exceptions import NoSuchTableError

        catalog = self._catalog()

        def load_or_create() -> Table | None:
            try:
                return catalog.load_table(self.table_name)
            except NoSuchTableError:
                if create_from is None:
                    return None
            catalog.create_namespace_if_not_exists(self.table_name.rsplit(".", 1)[0])
            return catalog.create_table(self.table_name, schema=optional_schema(create_from))

        try:
            return after_creation_races(load_or_create)
        except Exception as exc:
            doing = "loading" if create_from is None else "creating"
            raise self._catalog_error(doing, exc) from exc

    def _data_root(self) -> str | None:
        if self._root_cache is None:  # a table's location does not move: look it up once
            table = self._load()
            if table is None:
                return None
            location = f"{table.location().rstrip('/')}/data"
            self._root_cache = table.properties.get(DATA_PATH_PROPERTY) or location
        return self._root_cache

    # -- schema ------------------------------------------------------------------------------

    def _checked_table(self, arrow_schema: pyarrow.Schema) -> Table:
        """Create the table from the batch if absent; refuse a batch of another schema."""
        from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids

        table = self._load(create_from=arrow_schema)
        assert table is not None  # created from the batch at the latest
        try:
            batch = _pyarrow_to_schema_without_ids(arrow_schema)
        except (ValueError, TypeError) as exc:
            raise SinkError(
                f"sink {self.sink_id!r}: the batch has a type Iceberg cannot store: "
                f"{first_line(exc)}"
            ) from exc
        problem = schema_mismatch(table.schema(), batch)
        if problem is not None:
            raise SinkError(
                f"sink {self.sink_id!r}: Iceberg table {self.table_name!r} has another schema: "
                f"{problem}; nothing was written"
            )
        return table

    @staticmethod
    def _flat_ids(table: Table) -> dict[str, int] | None:
        """Top-level field ids, if every column is primitive: Java Iceberg reads a file that
        has ids on some fields only by ids, dropping nested values; the name mapping (set at
        commit) serves files without ids.
        """
        fields = table.schema().fields
        if any(not field.field_type.is_primitive for field in fields):
            return None
        return {field.name: field.field_id for field in fields}

    def _prepare_spark(self, df: pyspark.sql.DataFrame) -> pyspark.sql.DataFrame:
        from pyspark.sql import functions as F

        try:
            spark_arrow_schema = arrow_schema(df.schema, timezone="UTC")
        except (TypeError, AssertionError) as exc:
            raise SinkError(
                f"sink {self.sink_id!r}: the batch has a type Iceberg cannot store: {exc}"
            ) from exc
        ids = self._flat_ids(self._checked_table(spark_arrow_schema))
        if ids is None:
            return df
        return df.select(
            *(F.col(f"`{n}`").alias(n, metadata={"parquet.field.id": ids[n]}) for n in df.columns)
        )

    def _prepare_arrow(self, table: pyarrow.Table) -> pyarrow.Table:
        import pyarrow as pa

        table = micros_timestamps(table)
        ids = self._flat_ids(self._checked_table(table.schema))
        if ids is None:
            return table
        return table.cast(
            pa.schema(
                f.with_metadata({b"PARQUET:field_id": str(ids[f.name]).encode()})
                for f in table.schema
            )
        )

    # -- commit ------------------------------------------------------------------------------

    def _summary_txn_ids(self, table: Table) -> set[str]:
        """The sink's transactions in the table: in the summaries of the snapshots still in
        the history, and in the commit records that ``expire_snapshots`` does not remove.
        """
        found = set(self._commit_records(table))
        for snapshot in table.snapshots():
            summary = snapshot.summary
            if summary is not None and summary.get(SINK_ID_KEY) == self.sink_id:
                found |= txn_ids_of(summary, TXN_ID_KEY)
        return found

    def _commit_records(self, table: Table) -> dict[str, str]:
        """Transaction id -> table property key of this sink's commit records."""
        prefix = f"{COMMITTED_PROPERTY_PREFIX}{self.sink_id}/"
        return {k[len(prefix) :]: k for k in table.properties if k.startswith(prefix)}

    def _record_commit(self, transaction: Transaction, table: Table, txn_ids: list[str]) -> None:
        """In the same table commit: a record of ``txn_ids`` in the table's properties, which
        snapshot expiry keeps, so a replay after a crash before the committed markers and an
        expiry still finds the commit. Records of transactions whose marker exists (which
        says the same) are dropped, so they stay as few as the commits not yet marked.
        """
        prefix = f"{COMMITTED_PROPERTY_PREFIX}{self.sink_id}/"
        marked = [key for t, key in self._commit_records(table).items() if self._has_marker(t)]
        if marked:
            transaction.remove_properties(*marked)
        transaction.set_properties({f"{prefix}{t}": "1" for t in txn_ids})

    def _table_txn_ids(self) -> set[str]:
        table = self._load()
        return set() if table is None else self._summary_txn_ids(table)

    def _table_committed(self, candidates: dict[str, dict[str, Any] | None]) -> set[str]:
        return set(candidates) & self._table_txn_ids()

    def table_commits(self) -> list[str | None]:
        """Snapshots by sequence number: this sink's transaction id, None for other writers."""
        table = self._load()
        if table is None:
            return []
        commits: list[str | None] = []
        for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0):
            summary = snapshot.summary
            mine = summary is not None and summary.get(SINK_ID_KEY) == self.sink_id
            commits.append(str(summary[TXN_ID_KEY]) if mine and summary is not None else None)
        return commits

    def table_files(self) -> set[str]:
        """Paths of the data files the current snapshot's scan plans."""
        table = self._load()
        if table is None or table.current_snapshot() is None:
            return set()
        return {task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()}

    def _publish(self, txn_id: str, manifest: dict[str, Any]) -> bool:
        uris = self._require_files(txn_id, manifest)
        return self._commit_snapshot([txn_id], uris, str(manifest.get("checkpoint_id")))

    def _publish_replacing(self, manifests: dict[str, dict[str, Any]]) -> bool:
        uris = [uri for t, m in manifests.items() for uri in self._require_files(t, m)]
        checkpoints = {str(m.get("checkpoint_id")) for m in manifests.values()}
        return self._commit_snapshot(list(manifests), uris, max(checkpoints, default=""), True)

    def _slice_expression(self) -> BooleanExpression:
        from pyiceberg.expressions import And, EqualTo

        assert self.replace_slice
        terms = [
            EqualTo(column, value)  # type: ignore[call-arg, arg-type]
            for column, value in self.replace_slice.items()
        ]
        return functools.reduce(And, terms)  # type: ignore[arg-type]

    def _replace_slice_in(
        self, transaction: Transaction, table: Table, files: list[DataFile], summary: dict[str, str]
    ) -> None:
        """Old slice out, new files in: one ``overwrite`` snapshot when every old file lies
        wholly in the slice (by its column statistics), else pyiceberg's delete (which
        rewrites mixed files) and an append, in the same table commit.
        """
        from pyiceberg.expressions.visitors import _StrictMetricsEvaluator

        expression = self._slice_expression()
        old = [task.file for task in table.scan(row_filter=expression).plan_files()]
        strict = _StrictMetricsEvaluator(table.schema(), expression)
        if old and all(strict.eval(f) for f in old):
            update = transaction.update_snapshot(snapshot_properties=summary)
            with update.overwrite() as overwrite:
                for data_file in old:
                    overwrite.delete_data_file(data_file)
                for data_file in files:
                    overwrite.append_data_file(data_file)
            return
        if old:
            transaction.delete(expression, snapshot_properties=summary)
        self._append_in(transaction, files, summary)

    def _summary(self, txn_ids: list[str], checkpoint_id: str, replace: bool) -> dict[str, str]:
        summary = {SINK_ID_KEY: self.sink_id, TXN_ID_KEY: txn_ids[0]}
        summary[CHECKPOINT_ID_KEY] = checkpoint_id
        if replace:
            summary[TXN_IDS_KEY] = ",".join(txn_ids)
            summary[SLICE_KEY] = json.dumps(self.replace_slice, sort_keys=True)
        return summary

    @staticmethod
    def _append_in(
        transaction: Transaction, files: list[DataFile], summary: dict[str, str]
    ) -> None:
        with transaction.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)

    def _commit_snapshot(
        self, txn_ids: list[str], uris: list[str], checkpoint_id: str, replace: bool = False
    ) -> bool:
        """ONE snapshot adding the files (and, replacing, removing the slice's), recording the
        transaction ids; False if the history already has them. A commit lost to another writer
        is retried on the new table version (``commit_retry``).
        """
        summary = self._summary(txn_ids, checkpoint_id, replace)
        return commit_retrying(
            self.sink_id,
            txn_ids[0],
            repr(self.table_name),
            lambda: self._try_commit_snapshot(txn_ids, uris, summary, replace),
        )

    def _try_commit_snapshot(
        self, txn_ids: list[str], uris: list[str], summary: dict[str, str], replace: bool
    ) -> bool:
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        table = self._load()
        if table is None:
            raise SinkError(f"sink {self.sink_id!r}: table {self.table_name!r} was dropped")
        if set(txn_ids) & self._summary_txn_ids(table):
            return False
        try:
            files = [parquet_file_to_data_file(table.io, table.metadata, u) for u in uris]
        except ValueError as exc:  # the table's schema changed since the files were written
            raise SinkError(
                f"sink {self.sink_id!r}: the staged files of {txn_ids[0]!r} do not match "
                f"table {self.table_name!r} any more: {first_line(exc)}; nothing was committed"
            ) from exc
        # pyiceberg retries a lost commit by appending the files again on top of the winner's
        # snapshot; ours re-reads the history first, so a replay stays a no-op.
        properties = {**table.metadata.properties, COMMIT_NUM_RETRIES: "0"}
        table.metadata = table.metadata.model_copy(update={"properties": properties})
        try:
            with table.transaction() as transaction:
                if table.metadata.name_mapping() is None:
                    mapping = table.schema().name_mapping.model_dump_json()
                    transaction.set_properties({NAME_MAPPING_PROPERTY: mapping})
                self._record_commit(transaction, table, txn_ids)
                if replace:
                    self._replace_slice_in(transaction, table, files, summary)
                else:
                    self._append_in(transaction, files, summary)
        except CommitFailedException as exc:  # another writer committed first
            raise CommitConflict(first_line(exc)) from exc
        except Exception as exc:
            raise self._catalog_error("committing to", exc) from exc
        return True

    # -- readers -----------------------------------------------------------------------------

    def table(self) -> Table | None:
        """The pyiceberg table (freshly loaded), for readers; None if absent."""
        return self._load()

    def read_arrow(self) -> pyarrow.Table:
        """The table's current snapshot, as Arrow (small tables)."""
        import pyarrow as pa

        table = self._load()
        return pa.table({}) if table is None else table.scan().to_arrow()

    def __repr__(self) -> str:
        return f"IcebergTableSink(sink_id={self.sink_id!r}, table={self.table_name!r})"


def _rebuild(sink_id: str, table: str, arguments: dict[str, Any]) -> IcebergTableSink:
    return IcebergTableSink(sink_id, table, **arguments)
