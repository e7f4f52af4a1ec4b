"""A SQL table (PostgreSQL or SQLite) fed through a staging table and committed in one transaction.

- write: rows go into ``<table>__staging`` tagged with the transaction id (column
  ``finalckpt_txn_id``), each write in its own database transaction, so staged rows are durable.
  ``write_spark`` stages from the executors, in parallel: each Spark task opens its own
  connection and bulk-loads its partition (PostgreSQL ``COPY``, SQLite ``executemany``) in one
  database transaction that also claims the partition in ``finalckpt_sink_writes``; nothing
  passes through the driver. The driver then marks the write complete there.
- precommit: seals the transaction with a row in ``finalckpt_sink_precommits`` (row count,
  checkpoint id); later writes to it are refused, and so is a transaction with a Spark write that
  did not complete (some partitions staged, the job failed).
- commit: ONE database transaction inserts the commit record into ``finalckpt_sink_commits``
  (primary key sink_id + txn_id) and moves the rows from staging into the target table. If the
  record already exists nothing happens and commit returns False, so a commit replayed after a
  crash, or racing another process, never duplicates rows.

This class composes those steps; the table definitions and name checks are in ``sql_tables``,
the bookkeeping rows in ``sql_bookkeeping``, what a Spark task runs in ``sql_staging``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Engine,
    MetaData,
    Table,
    delete,
    func,
    insert,
    inspect,
    select,
    tuple_,
)
from sqlalchemy.types import TypeEngine

from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.pyspark_compat import arrow_schema, to_arrow
from airflow_finalckpt.sinks.base import (
    AlreadyCommittedError,
    NotPrecommittedError,
    SinkError,
    SinkTransactionError,
    TwoPhaseCommitSink,
    check_slice,
)
from airflow_finalckpt.sinks.connections import ConnectionFields, database_url
from airflow_finalckpt.sinks.sql_bookkeeping import SinkBookkeeping
from airflow_finalckpt.sinks.sql_staging import (
    PartitionWrite,
    estimated_bytes,
    local_executors_use_this_python,
    stage_partition,
)
from airflow_finalckpt.sinks.sql_tables import (
    COMMITS_TABLE,
    COUNT_ROWS,
    PRECOMMITS_TABLE,
    STAGING_SUFFIX,
    SUPPORTED_DIALECTS,
    TXN_COLUMN,
    WRITES_TABLE,
    check_column_name,
    check_table_name,
    column_definitions,
    create_tables,
    define_staging,
    define_target,
    guard_sqlite_directory,
    in_slice,
    reflect_staging,
    sql_type_for_arrow,
)
from airflow_finalckpt.store.engine import make_engine

if TYPE_CHECKING:
    import pandas
    import pyarrow
    import pyspark.sql
    from sqlalchemy import Connection

__all__ = [
    "COMMITS_TABLE",
    "DRIVER_WRITE_MAX_BYTES",
    "PRECOMMITS_TABLE",
    "WRITES_TABLE",
    "SqlTableSink",
    "estimated_bytes",
    "sql_type_for_arrow",
]

#: ``write_spark`` stages a frame estimated at most this size through the driver (Spark's own
#: ``spark.sql.autoBroadcastJoinThreshold`` default: a size it collects to the driver anyway).
DRIVER_WRITE_MAX_BYTES = 10 * 1024 * 1024


class SqlTableSink(TwoPhaseCommitSink):
    """Two-phase-commit sink appending (or, with ``key_columns``, upserting) into a SQL table.

    ``columns`` defines the table when it must be created; without it the first written frame's
    types do. With ``key_columns`` a commit replaces target rows with the same key (the created
    table gets them as primary key) and a transaction may hold each key once.

    :param sink_id: the sink's id, unique in the pipeline (it names its transactions).
    :param url: the database's SQLAlchemy URL (``postgresql+psycopg://...`` or
        ``sqlite:////abs/path.db``); or, keeping credentials out of DAG code, ``conn_id``.
    :param table: the target table (a plain identifier, created if missing).
    :param columns: ``{name: SQLAlchemy type}`` defining the table when it is created;
        default: the first written frame's Arrow types.
    :param key_columns: columns whose values identify a row: a commit replaces the rows with
        the same key (upsert), a created table gets them as primary key.
    :param driver_write_max_bytes: a Spark frame estimated at most this size is staged through
        the driver (one partition), a larger one from the executors; 0: always the executors.
    :param conn_id: an Airflow connection (``postgres`` or ``sqlite``) giving the URL, resolved
        when the task runs, never when the DAG is parsed; instead of ``url``.
    :param replace_slice: ``{column: value}``, the slice of the table one pipeline run owns
        (templated, e.g. ``{"event_date": "{{ ds }}"}``): the stage's commit replaces its rows
        atomically (needs ``commit_mode="final"``); None appends.
    """

    def __init__(
        self,
        sink_id: str,
        url: str | None = None,
        table: str | None = None,
        columns: dict[str, TypeEngine[Any] | type[TypeEngine[Any]]] | None = None,
        key_columns: list[str] | tuple[str, ...] | None = None,
        driver_write_max_bytes: int = DRIVER_WRITE_MAX_BYTES,
        *,
        conn_id: str | None = None,
        replace_slice: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(sink_id)
        self.replace_slice = check_slice(sink_id, replace_slice)
        self.driver_write_max_bytes = int(driver_write_max_bytes)
        if table is None:
            raise ConfigurationError(f"sink {sink_id!r}: argument table is required")
        self.table_name = check_table_name(table)
        self.columns = dict(columns) if columns else None
        for name in self.columns or {}:
            check_column_name(name)
        self.key_columns = tuple(key_columns or ())
        for name in self.key_columns:
            check_column_name(name)
            if self.columns is not None and name not in self.columns:
                raise ConfigurationError(
                    f"key column {name!r} is not one of columns {self.columns}"
                )
        if (url is None) == (conn_id is None):
            raise ConfigurationError(
                f"sink {sink_id!r}: pass either url= (a SQLAlchemy URL) or conn_id= (an Airflow "
                "connection, resolved when the task runs), not both or neither"
            )
        #: the Airflow connection the URL comes from (None: ``url`` given)
        self.conn_id = conn_id
        self.bound_connection: ConnectionFields | None = None
        self._engine: Engine | None = None
        self._target: Table | None = None
        self._staging: Table | None = None
        if url is not None:
            self._open(url)

    def _open(self, url: str) -> None:
        engine = make_engine(url)
        if engine.dialect.name not in SUPPORTED_DIALECTS:
            raise ConfigurationError(
                f"sink {self.sink_id!r}: argument url: SqlTableSink supports "
                f"{', '.join(SUPPORTED_DIALECTS)}, not {engine.dialect.name!r}"
            )
        guard_sqlite_directory(self.sink_id, engine)
        self._engine = engine
        self._books = SinkBookkeeping(self.sink_id, engine)

    @property
    def connection_id(self) -> str | None:
        """The Airflow connection this sink's URL comes from (``conn_id``)."""
        return self.conn_id

    def bind_connection(self, fields: ConnectionFields) -> None:
        """Open the database the resolved connection names (the task or driver side)."""
        self._open(database_url(fields, f"sink {self.sink_id!r}"))
        self.bound_connection = fields

    @property
    def engine(self) -> Engine:
        """The database engine; a ``conn_id`` sink has one once its connection is bound."""
        if self._engine is None:
            raise ConfigurationError(
                f"sink {self.sink_id!r}: Airflow connection {self.conn_id!r} is resolved when "
                "the stage task runs; bind it first (hooks.sink_connections)"
            )
        return self._engine

    def __reduce__(self) -> tuple[Any, ...]:
        """Picklable (shipped to a submitted Spark driver): rebuilt from its arguments, with a
        fresh engine; a ``url`` keeps its password (treat the pickle as a secret), a
        ``conn_id`` sink pickles the connection's id only and is bound again on the driver.
        """
        url = None if self.conn_id else self.engine.url.render_as_string(hide_password=False)
        keys = list(self.key_columns) or None
        args = (self.sink_id, url, self.table_name, self.columns, keys, self.driver_write_max_bytes)
        return (_rebuild, (type(self), args, self.replace_slice, self.conn_id))

    @property
    def asset_uri(self) -> str:
        """``postgres://host:port/database/public/<table>`` (the Postgres provider's scheme);
        ``sqlite:///<database file>/<table>`` for SQLite; ``sql://<conn_id>/<table>`` for a
        ``conn_id`` sink before its connection is resolved (when the DAG is parsed).
        """
        if self._engine is None:  # named by its connection until the task resolves it
            return f"sql://{self.conn_id}/{self.table_name}"
        url = self.engine.url
        if self.engine.dialect.name == "postgresql":
            where = f"{url.host or 'localhost'}:{url.port or 5432}"
            return f"postgres://{where}/{url.database}/public/{self.table_name}"
        return f"sqlite:///{os.path.abspath(url.database or '')}/{self.table_name}"

    def target(self) -> str | None:
        """The table as the DAG names it: through its connection (resolved or not, so a
        check at parse time and one in the task agree), else its URL's database.
        """
        if self.conn_id is not None:
            return f"sql://{self.conn_id}/{self.table_name}"
        return super().target()

    @property
    def staging_table_name(self) -> str:
        """Where rows wait for their commit: the target's name with ``__staging``."""
        return self.table_name + STAGING_SUFFIX

    def staging_location(self, txn_id: str) -> str:
        """A description of where the rows are staged (rows are written with ``write_*``)."""
        txn_id = self._check_txn_id(txn_id)
        url = self.engine.url.render_as_string(hide_password=True)
        return f"{url}#{self.staging_table_name}?{TXN_COLUMN}={txn_id}"

    def dispose(self) -> None:
        """Close the engine's pooled connections."""
        self.engine.dispose()

    # -- schema ------------------------------------------------------------------------------

    def _data_tables(
        self, arrow_schema: pyarrow.Schema | None = None
    ) -> tuple[Table, Table] | None:
        """The target and staging tables: reflected if present, else created from ``columns``
        or ``arrow_schema``; None if neither exists nor can be defined yet.
        """
        if self._target is not None and self._staging is not None:
            return self._target, self._staging
        existing = set(inspect(self.engine).get_table_names())
        if self.table_name in existing:
            target = Table(self.table_name, MetaData(), autoload_with=self.engine)
            self._check_declared_columns(target)
        else:
            definitions = column_definitions(self.columns, arrow_schema)
            if definitions is None:
                return None
            target = define_target(self.table_name, definitions, self.key_columns)
        staging = define_staging(target)
        create_tables(self.engine, target.metadata)
        create_tables(self.engine, staging.metadata)
        if self.staging_table_name in existing:
            staging = reflect_staging(self.engine, self.staging_table_name, target)
        self._target, self._staging = target, staging
        return target, staging

    def _check_declared_columns(self, target: Table) -> None:
        unknown = set(self.columns or {}) | set(self.key_columns)
        unknown -= set(target.columns.keys())
        if unknown:
            raise ConfigurationError(
                f"table {self.table_name!r} exists without columns {sorted(unknown)}"
            )

    # -- state -------------------------------------------------------------------------------

    def is_committed(self, txn_id: str) -> bool:
        """Whether the transaction's commit record exists."""
        txn_id = self._check_txn_id(txn_id)
        self._books.ensure()
        with self.engine.connect() as conn:
            return self._books.commit_record_exists(conn, txn_id)

    def committed_txn_ids(self) -> set[str]:
        """Every transaction of this sink with a commit record."""
        self._books.ensure()
        with self.engine.connect() as conn:
            return self._books.committed_txn_ids(conn)

    def staged_txn_ids(self) -> set[str]:
        """Transactions with staged rows or a pre-commit record (uncommitted by construction)."""
        self._books.ensure()
        with self.engine.connect() as conn:
            txn_ids = self._books.precommitted_txn_ids(conn)
            txn_ids |= self._books.written_txn_ids(conn)
        tables = self._data_tables()
        if tables is not None:
            with self.engine.connect() as conn:
                txn_ids |= set(conn.execute(select(tables[1].c[TXN_COLUMN]).distinct()).scalars())
        return txn_ids

    # -- writing -----------------------------------------------------------------------------

    def write_arrow(self, txn_id: str, table: pyarrow.Table) -> None:
        """Stage an Arrow table's rows; they are durable when this returns."""
        txn_id = self._check_txn_id(txn_id)
        self._books.ensure()
        tables = self._data_tables(table.schema)
        assert tables is not None  # defined from table.schema at the latest
        target, staging = tables
        unknown = set(table.column_names) - set(target.columns.keys())
        if unknown:
            raise SinkError(
                f"sink {self.sink_id!r}: columns {sorted(unknown)} are not in table "
                f"{self.table_name!r} (it has {list(target.columns.keys())})"
            )
        self._check_unique_keys_in(table)
        rows = [{**row, TXN_COLUMN: txn_id} for row in table.to_pylist()]
        with self.engine.begin() as conn:
            self._books.check_open(conn, txn_id)
            if rows:
                conn.execute(insert(staging), rows)

    def _check_unique_keys_in(self, table: pyarrow.Table) -> None:
        if not self.key_columns or table.num_rows == 0:
            return
        keys = table.select(list(self.key_columns)).to_pylist()
        if len({tuple(key.values()) for key in keys}) != len(keys):
            raise SinkError(
                f"sink {self.sink_id!r}: the rows repeat a key {self.key_columns}; "
                "a transaction may hold each key once"
            )

    def write_pandas(self, txn_id: str, frame: pandas.DataFrame) -> None:
        """Stage a pandas frame's rows (its index is dropped)."""
        import pyarrow as pa

        self.write_arrow(txn_id, pa.Table.from_pandas(frame, preserve_index=False))

    def write_spark(self, txn_id: str, df: pyspark.sql.DataFrame) -> None:
        """Stage a Spark DataFrame from the executors, in parallel; no row reaches the driver.

        A frame whose plan Spark estimates at most ``driver_write_max_bytes`` (default 10 MiB,
        Spark's broadcast threshold: small enough to collect) is collected and staged by the
        driver as one partition instead; 0 turns that off.

        Each partition is loaded by its Spark task over its own connection (PostgreSQL ``COPY``,
        SQLite ``executemany``; SQLite takes one writer at a time, so partitions queue on its
        busy timeout). The executors need this package, SQLAlchemy and the database driver, and
        must reach the database. A task attempt that finds its partition already staged (retry,
        speculation) stages nothing. An in-memory SQLite database, which executors cannot
        reach, is written through the driver.
        """
        txn_id = self._check_txn_id(txn_id)
        self._check_rows_in_slice(df)
        url = self.engine.url
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            self.write_arrow(txn_id, to_arrow(df))
            return
        self._books.ensure()
        zone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
        tables = self._data_tables(arrow_schema(df.schema, timezone=zone))
        assert tables is not None  # defined from the frame's schema at the latest
        target, staging = tables
        unknown = [name for name in df.columns if name not in target.columns]
        if unknown or len(set(df.columns)) != len(df.columns):
            raise SinkError(
                f"sink {self.sink_id!r}: columns {sorted(unknown) or df.columns} are not in "
                f"table {self.table_name!r} or repeat (it has {list(target.columns.keys())})"
            )
        if url.get_backend_name() == "sqlite":  # executors may run elsewhere than the cwd
            url = url.set(database=os.path.abspath(url.database or ""))
        spec = PartitionWrite(
            url=url.render_as_string(hide_password=False),
            sink_id=self.sink_id,
            txn_id=txn_id,
            write_id=uuid.uuid4().hex,
            staging_table=staging.name,
            columns=tuple(df.columns),
        )
        with self.engine.begin() as conn:
            self._books.check_open(conn, txn_id)
            self._books.open_write(conn, txn_id, spec.write_id)
        estimate = estimated_bytes(df)
        if estimate is not None and estimate <= self.driver_write_max_bytes:
            # Small (the size Spark would broadcast): the driver collects it and stages it as one
            # partition, which costs less than starting the executors' Python workers (seconds
            # in a fresh SparkSession).
            rows = stage_partition(spec, 0, iter(to_arrow(df).to_batches()))
        else:
            with local_executors_use_this_python(df):
                staged = df.mapInArrow(spec, "rows long")
            rows = sum(int(row["rows"]) for row in staged.collect())
        self._complete_write(txn_id, spec.write_id, rows)

    def _complete_write(self, txn_id: str, write_id: str, rows: int) -> None:
        """Mark a Spark write complete once its job succeeded (pre-commit checks the marks)."""
        with self.engine.begin() as conn:
            self._books.check_open(conn, txn_id)
            self._books.complete_write(conn, txn_id, write_id, rows)

    # -- two-phase commit --------------------------------------------------------------------

    def precommit(self, txn_id: str, checkpoint_id: int) -> SinkTransaction:
        """Seal the transaction: count its staged rows and record the pre-commit.

        Idempotent: pre-committing again (a later checkpoint) updates the checkpoint id.
        """
        txn_id = self._check_txn_id(txn_id)
        self._books.ensure()
        tables = self._data_tables()
        with self.engine.begin() as conn:
            if self._books.commit_record_exists(conn, txn_id):
                raise AlreadyCommittedError(self.sink_id, txn_id, "pre-commit")
            self._books.check_writes_complete(conn, txn_id)
            rows = 0
            if tables is not None:
                staging = tables[1]
                self._check_unique_staged_keys(conn, staging, txn_id)
                count = select(func.count()).select_from(staging)
                rows = int(conn.execute(count.where(staging.c[TXN_COLUMN] == txn_id)).scalar_one())
            self._books.seal(conn, txn_id, checkpoint_id, rows)
        return SinkTransaction(
            sink_id=self.sink_id,
            txn_id=txn_id,
            checkpoint_id=checkpoint_id,
            payload={
                "table": self.table_name,
                "staging_table": self.staging_table_name,
                "rows": rows,
            },
        )

    def _check_unique_staged_keys(self, conn: Connection, staging: Table, txn_id: str) -> None:
        """Fail at pre-commit, not at commit, when several writes staged the same key."""
        if not self.key_columns:
            return
        keys = [staging.c[name] for name in self.key_columns]
        duplicated = (
            select(*keys)
            .where(staging.c[TXN_COLUMN] == txn_id)
            .group_by(*keys)
            .having(func.count() > 1)
            .limit(1)
        )
        repeated = conn.execute(duplicated).first()
        if repeated is not None:
            raise SinkError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} stages key "
                f"{tuple(repeated)} more than once; a transaction may hold each key once"
            )

    def commit(self, txn: SinkTransaction) -> bool:
        """Record the commit and move the staged rows into the table, in one DB transaction."""
        self._check_owned(txn)
        self._require_checkpoint(txn)
        self._books.ensure()
        tables = self._data_tables()
        with self.engine.begin() as conn:
            return self._commit_in(conn, tables, txn)

    def commit_replacing(self, txns: Sequence[SinkTransaction]) -> bool:
        """Delete the slice's rows and move every transaction's staged rows in, in ONE
        database transaction with their commit records: readers see the old slice or the new
        one; a replay finds the records and changes nothing.
        """
        for txn in txns:
            self._check_owned(txn)
            self._require_checkpoint(txn)
        self._books.ensure()
        tables = self._data_tables()
        with self.engine.begin() as conn:
            for txn in txns:  # serialize with a racing commit or abort of the same group
                self._books.precommit_row(conn, txn.txn_id, lock=True)
            done = [self._books.commit_record_exists(conn, t.txn_id) for t in txns]
            if txns and any(done):
                return False
            if tables is not None and self.replace_slice:
                target = tables[0]
                for column in self.replace_slice:
                    if column not in target.columns:
                        raise SinkError(
                            f"sink {self.sink_id!r}: replace_slice column {column!r} is not a "
                            f"column of table {self.table_name!r}; nothing was committed"
                        )
                backend = self.engine.url.get_backend_name()
                conn.execute(delete(target).where(in_slice(target, self.replace_slice, backend)))
            for txn in txns:
                if not self._commit_in(conn, tables, txn):
                    raise SinkTransactionError(
                        f"sink {self.sink_id!r}: transaction {txn.txn_id!r} committed by "
                        "another process during a slice replace; nothing was committed"
                    )
        return True

    def _commit_in(
        self, conn: Connection, tables: tuple[Table, Table] | None, txn: SinkTransaction
    ) -> bool:
        txn_id = txn.txn_id
        # Lock the pre-commit row first: a racing commit or abort waits here, then finds it
        # gone and sees the winner's commit record.
        sealed = self._books.precommit_row(conn, txn_id, lock=True)
        if sealed is None:
            if self._books.commit_record_exists(conn, txn_id):
                return False
            raise NotPrecommittedError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} has no pre-committed rows to "
                "commit: it was never pre-committed or it was aborted"
            )
        checkpoint_id = txn.checkpoint_id if txn.checkpoint_id is not None else 0
        if not self._books.insert_commit_record(conn, txn_id, int(sealed.rows), checkpoint_id):
            return False
        moved = self._move_staged_rows(conn, tables, txn_id) if tables else 0
        if moved != sealed.rows:
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} was pre-committed with "
                f"{sealed.rows} rows but {moved} are staged; nothing was committed"
            )
        self._books.unseal(conn, txn_id)
        self._books.set_committed_rows(conn, txn_id, moved)
        self._books.forget_writes(conn, txn_id)
        return True

    def _move_staged_rows(self, conn: Connection, tables: tuple[Table, Table], txn_id: str) -> int:
        target, staging = tables
        names = list(target.columns.keys())
        of_txn = staging.c[TXN_COLUMN] == txn_id
        if self.key_columns:
            target_key = tuple_(*(target.c[name] for name in self.key_columns))
            staged_keys = select(*(staging.c[name] for name in self.key_columns)).where(of_txn)
            conn.execute(delete(target).where(target_key.in_(staged_keys)))
        staged_rows = select(*(staging.c[name] for name in names)).where(of_txn)
        moving = insert(target).from_select(names, staged_rows)
        moved = conn.execute(moving, execution_options=COUNT_ROWS).rowcount
        conn.execute(delete(staging).where(of_txn))
        return int(moved)

    def abort(self, txn: SinkTransaction) -> None:
        """Delete the staged rows and the pre-commit record; refused once committed."""
        txn_id = self._check_owned(txn)
        self._books.ensure()
        tables = self._data_tables()
        with self.engine.begin() as conn:
            self._books.precommit_row(conn, txn_id, lock=True)  # serialize with a racing commit
            if self._books.commit_record_exists(conn, txn_id):
                raise AlreadyCommittedError(self.sink_id, txn_id, "abort")
            # Tasks of a failed Spark job may still be staging: wait for them, fence later ones.
            self._books.wait_for_writing_partitions(conn, txn_id)
            if tables is not None:
                conn.execute(delete(tables[1]).where(tables[1].c[TXN_COLUMN] == txn_id))
            self._books.forget_writes(conn, txn_id)
            self._books.unseal(conn, txn_id)

    # -- readers -----------------------------------------------------------------------------

    def read_pandas(self) -> pandas.DataFrame:
        """The target table's (committed) rows."""
        import pandas as pd

        tables = self._data_tables()
        if tables is None:
            return pd.DataFrame()
        target = tables[0]
        order = [target.c[name] for name in self.key_columns]
        with self.engine.connect() as conn:
            result = conn.execute(select(target).order_by(*order))
            return pd.DataFrame(result.fetchall(), columns=list(result.keys()))

    def read_spark(self, spark: pyspark.sql.SparkSession) -> pyspark.sql.DataFrame:
        """The target table's rows as a Spark DataFrame (through the driver: small tables)."""
        frame = self.read_pandas()
        if frame.empty and not len(frame.columns):
            from pyspark.sql.types import StructType

            return spark.createDataFrame([], StructType([]))
        return spark.createDataFrame(frame)

    def __repr__(self) -> str:
        if self._engine is None:
            where = f"conn_id={self.conn_id!r}"
        else:
            where = f"url={self._engine.url.render_as_string(hide_password=True)!r}"
        return f"SqlTableSink(sink_id={self.sink_id!r}, {where}, table={self.table_name!r})"


def _rebuild(
    cls: type[SqlTableSink],
    args: tuple[Any, ...],
    replace_slice: dict[str, Any] | None,
    conn_id: str | None = None,
) -> SqlTableSink:
    return cls(*args, replace_slice=replace_slice, conn_id=conn_id)
