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
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Double,
    Engine,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    delete,
    event,
    func,
    insert,
    inspect,
    select,
    tuple_,
    update,
)
from sqlalchemy.exc import DatabaseError
from sqlalchemy.types import TypeEngine

from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.core.model import SinkTransaction
from airflow_finalckpt.sinks.base import (
    AlreadyCommittedError,
    InvalidIdentifierError,
    NotPrecommittedError,
    SinkError,
    SinkTransactionError,
    TwoPhaseCommitSink,
)
from airflow_finalckpt.store.engine import make_engine

if TYPE_CHECKING:
    import pandas
    import pyarrow
    import pyspark.sql
    from sqlalchemy import Connection

COMMITS_TABLE = "finalckpt_sink_commits"
PRECOMMITS_TABLE = "finalckpt_sink_precommits"
#: Partitions staged by ``write_spark`` (part >= 0) and completed writes (part = WRITE_DONE).
WRITES_TABLE = "finalckpt_sink_writes"
WRITE_DONE = -1
#: How long a Spark task waits for SQLite's write lock while other partitions are staged.
SQLITE_STAGING_BUSY_TIMEOUT_MS = 30 * 60 * 1000
STAGING_SUFFIX = "__staging"
TXN_COLUMN = "finalckpt_txn_id"
ID_TYPE = String(200)

#: Unquoted-safe SQL names; 54 characters leaves room for the suffix within PostgreSQL's 63.
SAFE_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,53}")
SAFE_COLUMN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

SUPPORTED_DIALECTS = ("postgresql", "sqlite")

#: Without it SQLAlchemy 2.1 on psycopg reports rowcount -1 for INSERTs; the counts matter here.
COUNT_ROWS = {"preserve_rowcount": True}


#: ``write_spark`` stages a frame estimated at most this size through the driver (Spark's own
#: ``spark.sql.autoBroadcastJoinThreshold`` default: a size it collects to the driver anyway).
DRIVER_WRITE_MAX_BYTES = 10 * 1024 * 1024


def _bookkeeping_metadata() -> MetaData:
    metadata = MetaData()
    Table(
        COMMITS_TABLE,
        metadata,
        Column("sink_id", ID_TYPE, primary_key=True),
        Column("txn_id", ID_TYPE, primary_key=True),
        Column("committed_at", Float, nullable=False),
        Column("rows", BigInteger, nullable=False),
        Column("checkpoint_id", BigInteger, nullable=True),
    )
    Table(
        PRECOMMITS_TABLE,
        metadata,
        Column("sink_id", ID_TYPE, primary_key=True),
        Column("txn_id", ID_TYPE, primary_key=True),
        Column("checkpoint_id", BigInteger, nullable=False),
        Column("rows", BigInteger, nullable=False),
        Column("precommitted_at", Float, nullable=False),
    )
    Table(
        WRITES_TABLE,
        metadata,
        Column("sink_id", ID_TYPE, primary_key=True),
        Column("txn_id", ID_TYPE, primary_key=True),
        Column("write_id", String(64), primary_key=True),
        Column("part", Integer, primary_key=True, autoincrement=False),
        Column("rows", BigInteger, nullable=False),
    )
    return metadata


def sql_type_for_arrow(arrow_type: pyarrow.DataType) -> TypeEngine[Any]:
    """The column type a new table gets for an Arrow (or pandas) column type."""
    import pyarrow.types as pat

    if pat.is_boolean(arrow_type):
        return Boolean()
    if pat.is_int8(arrow_type) or pat.is_int16(arrow_type) or pat.is_uint8(arrow_type):
        return Integer()
    if pat.is_int32(arrow_type) or pat.is_uint16(arrow_type):
        return Integer()
    if pat.is_integer(arrow_type):
        return BigInteger()
    if pat.is_float16(arrow_type) or pat.is_float32(arrow_type):
        return Float()
    if pat.is_float64(arrow_type):
        return Double()
    if pat.is_decimal(arrow_type):
        return Numeric(arrow_type.precision, arrow_type.scale)
    if pat.is_string(arrow_type) or pat.is_large_string(arrow_type) or pat.is_null(arrow_type):
        return Text()
    if pat.is_binary(arrow_type) or pat.is_large_binary(arrow_type):
        return LargeBinary()
    if pat.is_timestamp(arrow_type):
        return DateTime(timezone=arrow_type.tz is not None)
    if pat.is_date(arrow_type):
        return Date()
    raise SinkError(
        f"no SQL column type for Arrow type {arrow_type}; pass columns= explicitly to SqlTableSink"
    )


class SqlTableSink(TwoPhaseCommitSink):
    """Two-phase-commit sink appending (or, with ``key_columns``, upserting) into a SQL table.

    ``columns`` defines the table when it must be created; without it the first written frame's
    types do. With ``key_columns`` a commit replaces target rows with the same key (the created
    table gets them as primary key) and a transaction may hold each key once.
    """

    def __init__(
        self,
        sink_id: str,
        url: str,
        table: str,
        columns: dict[str, TypeEngine[Any] | type[TypeEngine[Any]]] | None = None,
        key_columns: list[str] | tuple[str, ...] | None = None,
        driver_write_max_bytes: int = DRIVER_WRITE_MAX_BYTES,
    ) -> None:
        super().__init__(sink_id)
        self.driver_write_max_bytes = int(driver_write_max_bytes)
        self.table_name = self._check_table_name(table)
        self.columns = dict(columns) if columns else None
        for name in self.columns or {}:
            self._check_column_name(name)
        self.key_columns = tuple(key_columns or ())
        for name in self.key_columns:
            self._check_column_name(name)
            if self.columns is not None and name not in self.columns:
                raise ConfigurationError(
                    f"key column {name!r} is not one of columns {self.columns}"
                )
        self.engine: Engine = make_engine(url)
        if self.engine.dialect.name not in SUPPORTED_DIALECTS:
            raise ConfigurationError(
                f"SqlTableSink supports {', '.join(SUPPORTED_DIALECTS)}, not "
                f"{self.engine.dialect.name!r}"
            )
        bookkeeping = _bookkeeping_metadata()
        self._commits = bookkeeping.tables[COMMITS_TABLE]
        self._precommits = bookkeeping.tables[PRECOMMITS_TABLE]
        self._writes = bookkeeping.tables[WRITES_TABLE]
        self._bookkeeping_ready = False
        self._target: Table | None = None
        self._staging: Table | None = None

    @staticmethod
    def _check_table_name(name: str) -> str:
        if not isinstance(name, str) or SAFE_TABLE_NAME.fullmatch(name) is None:
            raise InvalidIdentifierError(
                f"invalid table name {name!r}: use 1-54 ASCII letters, digits or '_', "
                "not starting with a digit"
            )
        return name

    @staticmethod
    def _check_column_name(name: str) -> str:
        if not isinstance(name, str) or SAFE_COLUMN_NAME.fullmatch(name) is None:
            raise InvalidIdentifierError(f"invalid column name {name!r}")
        if name == TXN_COLUMN:
            raise InvalidIdentifierError(f"column name {TXN_COLUMN!r} is reserved by the sink")
        return name

    def __reduce__(self) -> tuple[Any, ...]:
        """Picklable (shipped to a submitted Spark driver): rebuilt from its arguments, with a
        fresh engine; the URL keeps its password, so treat the pickle as a secret.
        """
        url = self.engine.url.render_as_string(hide_password=False)
        keys = list(self.key_columns) or None
        args = (self.sink_id, url, self.table_name, self.columns, keys, self.driver_write_max_bytes)
        return (type(self), args)

    @property
    def asset_uri(self) -> str:
        """``postgres://host:port/database/public/<table>`` (the Postgres provider's scheme);
        ``sqlite:///<database file>/<table>`` for SQLite.
        """
        url = self.engine.url
        if self.engine.dialect.name == "postgresql":
            where = f"{url.host or 'localhost'}:{url.port or 5432}"
            return f"postgres://{where}/{url.database}/public/{self.table_name}"
        return f"sqlite:///{os.path.abspath(url.database or '')}/{self.table_name}"

    @property
    def staging_table_name(self) -> str:
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

    def _create_tables(self, metadata: MetaData) -> None:
        """CREATE tables if missing; another process creating them at the same time is fine."""
        try:
            metadata.create_all(self.engine, checkfirst=True)
        except DatabaseError:
            names = set(inspect(self.engine).get_table_names())
            if not set(metadata.tables) <= names:
                raise

    def _ensure_bookkeeping(self) -> None:
        if not self._bookkeeping_ready:
            self._create_tables(self._commits.metadata)
            self._bookkeeping_ready = True

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
            definitions = self._column_definitions(arrow_schema)
            if definitions is None:
                return None
            target = self._define_target(definitions)
        staging = self._define_staging(target)
        self._create_tables(target.metadata)
        self._create_tables(staging.metadata)
        if self.staging_table_name in existing:
            staging = Table(self.staging_table_name, MetaData(), autoload_with=self.engine)
            missing = {c.name for c in target.columns} - {c.name for c in staging.columns}
            if missing or TXN_COLUMN not in staging.columns:
                raise SinkError(
                    f"staging table {self.staging_table_name!r} lacks columns "
                    f"{sorted(missing | ({TXN_COLUMN} - set(staging.columns.keys())))}; "
                    "drop it (it holds only uncommitted rows) to let the sink recreate it"
                )
        self._target, self._staging = target, staging
        return target, staging

    def _check_declared_columns(self, target: Table) -> None:
        unknown = set(self.columns or {}) | set(self.key_columns)
        unknown -= set(target.columns.keys())
        if unknown:
            raise ConfigurationError(
                f"table {self.table_name!r} exists without columns {sorted(unknown)}"
            )

    def _column_definitions(
        self, arrow_schema: pyarrow.Schema | None
    ) -> dict[str, TypeEngine[Any]] | None:
        if self.columns is not None:
            return {
                name: kind() if isinstance(kind, type) else kind
                for name, kind in self.columns.items()
            }
        if arrow_schema is None:
            return None
        return {
            self._check_column_name(field.name): sql_type_for_arrow(field.type)
            for field in arrow_schema
        }

    def _define_target(self, definitions: dict[str, TypeEngine[Any]]) -> Table:
        missing_keys = set(self.key_columns) - set(definitions)
        if missing_keys:
            raise ConfigurationError(f"key columns {sorted(missing_keys)} are not in the data")
        columns = [
            Column(name, kind, nullable=name not in self.key_columns)
            for name, kind in definitions.items()
        ]
        constraints = [PrimaryKeyConstraint(*self.key_columns)] if self.key_columns else []
        return Table(self.table_name, MetaData(), *columns, *constraints)

    def _define_staging(self, target: Table) -> Table:
        columns = [Column(column.name, column.type, nullable=True) for column in target.columns]
        return Table(
            self.staging_table_name,
            MetaData(),
            Column(TXN_COLUMN, ID_TYPE, nullable=False, index=True),
            *columns,
        )

    # -- state -------------------------------------------------------------------------------

    def _commit_record_exists(self, conn: Connection, txn_id: str) -> bool:
        query = select(self._commits.c.rows).where(
            self._commits.c.sink_id == self.sink_id, self._commits.c.txn_id == txn_id
        )
        return conn.execute(query).first() is not None

    def is_committed(self, txn_id: str) -> bool:
        txn_id = self._check_txn_id(txn_id)
        self._ensure_bookkeeping()
        with self.engine.connect() as conn:
            return self._commit_record_exists(conn, txn_id)

    def committed_txn_ids(self) -> set[str]:
        self._ensure_bookkeeping()
        query = select(self._commits.c.txn_id).where(self._commits.c.sink_id == self.sink_id)
        with self.engine.connect() as conn:
            return set(conn.execute(query).scalars())

    def staged_txn_ids(self) -> set[str]:
        """Transactions with staged rows or a pre-commit record (uncommitted by construction)."""
        self._ensure_bookkeeping()
        query = select(self._precommits.c.txn_id).where(self._precommits.c.sink_id == self.sink_id)
        writes = select(self._writes.c.txn_id).where(self._writes.c.sink_id == self.sink_id)
        with self.engine.connect() as conn:
            txn_ids = set(conn.execute(query).scalars())
            txn_ids |= set(conn.execute(writes.distinct()).scalars())
        tables = self._data_tables()
        if tables is not None:
            with self.engine.connect() as conn:
                txn_ids |= set(conn.execute(select(tables[1].c[TXN_COLUMN]).distinct()).scalars())
        return txn_ids

    # -- writing -----------------------------------------------------------------------------

    def write_arrow(self, txn_id: str, table: pyarrow.Table) -> None:
        """Stage an Arrow table's rows; they are durable when this returns."""
        txn_id = self._check_txn_id(txn_id)
        self._ensure_bookkeeping()
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
            self._check_open(conn, txn_id)
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

    def _check_open(self, conn: Connection, txn_id: str) -> None:
        if self._commit_record_exists(conn, txn_id):
            raise AlreadyCommittedError(self.sink_id, txn_id, "write to")
        if self._precommit_row(conn, txn_id) is not None:
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} is pre-committed and sealed; "
                "rows written now would not be covered by its checkpoint (open a new transaction)"
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
        url = self.engine.url
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            self.write_arrow(txn_id, df.toArrow())
            return
        from pyspark.sql.pandas.types import to_arrow_schema

        self._ensure_bookkeeping()
        zone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
        tables = self._data_tables(to_arrow_schema(df.schema, timezone=zone))
        assert tables is not None  # defined from the frame's schema at the latest
        target, staging = tables
        unknown = [name for name in df.columns if name not in target.columns]
        if unknown or len(set(df.columns)) != len(df.columns):
            raise SinkError(
                f"sink {self.sink_id!r}: columns {sorted(unknown) or df.columns} are not in "
                f"table {self.table_name!r} or repeat (it has {list(target.columns.keys())})"
            )
        with self.engine.begin() as conn:
            self._check_open(conn, txn_id)
        if url.get_backend_name() == "sqlite":  # executors may run elsewhere than the cwd
            url = url.set(database=os.path.abspath(url.database or ""))
        spec = _PartitionWrite(
            url=url.render_as_string(hide_password=False),
            sink_id=self.sink_id,
            txn_id=txn_id,
            write_id=uuid.uuid4().hex,
            staging_table=staging.name,
            columns=tuple(df.columns),
        )
        estimate = estimated_bytes(df)
        if estimate is not None and estimate <= self.driver_write_max_bytes:
            # Small (the size Spark would broadcast): the driver collects it and stages it as one
            # partition, which costs less than starting the executors' Python workers (seconds
            # in a fresh SparkSession).
            rows = _stage_partition(spec, 0, iter(df.toArrow().to_batches()))
        else:
            with _local_executors_use_this_python(df):
                staged = df.mapInArrow(spec, "rows long")
            rows = sum(int(row["rows"]) for row in staged.collect())
        self._complete_write(txn_id, spec.write_id, rows)

    def _complete_write(self, txn_id: str, write_id: str, rows: int) -> None:
        """Mark a Spark write complete once its job succeeded (pre-commit checks the marks)."""
        writes = self._writes
        of_write = (
            (writes.c.sink_id == self.sink_id)
            & (writes.c.txn_id == txn_id)
            & (writes.c.write_id == write_id)
        )
        with self.engine.begin() as conn:
            self._check_open(conn, txn_id)
            staged = conn.execute(
                select(func.coalesce(func.sum(writes.c.rows), 0)).where(
                    of_write, writes.c.part >= 0
                )
            ).scalar_one()
            if int(staged) != rows:
                raise SinkTransactionError(
                    f"sink {self.sink_id!r}: transaction {txn_id!r}: the Spark tasks reported "
                    f"{rows} rows but their partitions staged {staged}; abort the transaction"
                )
            conn.execute(
                insert(writes).values(
                    sink_id=self.sink_id,
                    txn_id=txn_id,
                    write_id=write_id,
                    part=WRITE_DONE,
                    rows=rows,
                )
            )

    def _check_writes_complete(self, conn: Connection, txn_id: str) -> None:
        writes = self._writes
        of_txn = (writes.c.sink_id == self.sink_id) & (writes.c.txn_id == txn_id)
        started = set(conn.execute(select(writes.c.write_id).where(of_txn).distinct()).scalars())
        done = set(
            conn.execute(
                select(writes.c.write_id).where(of_txn, writes.c.part == WRITE_DONE)
            ).scalars()
        )
        if started - done:
            raise SinkTransactionError(
                f"sink {self.sink_id!r}: transaction {txn_id!r} has a Spark write that did not "
                "complete (its job failed after staging some partitions); abort the transaction "
                "and write the data again under a new transaction id"
            )

    def _forget_writes(self, conn: Connection, txn_id: str) -> None:
        conn.execute(
            delete(self._writes).where(
                self._writes.c.sink_id == self.sink_id, self._writes.c.txn_id == txn_id
            )
        )

    # -- two-phase commit --------------------------------------------------------------------

    def _precommit_row(self, conn: Connection, txn_id: str, *, lock: bool = False) -> Any:
        query = select(self._precommits).where(
            self._precommits.c.sink_id == self.sink_id, self._precommits.c.txn_id == txn_id
        )
        return conn.execute(query.with_for_update() if lock else query).first()

    def precommit(self, txn_id: str, checkpoint_id: int) -> SinkTransaction:
        """Seal the transaction: count its staged rows and record the pre-commit.

        Idempotent: pre-committing again (a later checkpoint) updates the checkpoint id.
        """
        txn_id = self._check_txn_id(txn_id)
        self._ensure_bookkeeping()
        tables = self._data_tables()
        with self.engine.begin() as conn:
            if self._commit_record_exists(conn, txn_id):
                raise AlreadyCommittedError(self.sink_id, txn_id, "pre-commit")
            self._check_writes_complete(conn, txn_id)
            rows = 0
            if tables is not None:
                staging = tables[1]
                self._check_unique_staged_keys(conn, staging, txn_id)
                count = select(func.count()).select_from(staging)
                rows = int(conn.execute(count.where(staging.c[TXN_COLUMN] == txn_id)).scalar_one())
            where = (self._precommits.c.sink_id == self.sink_id) & (
                self._precommits.c.txn_id == txn_id
            )
            conn.execute(delete(self._precommits).where(where))
            conn.execute(
                insert(self._precommits).values(
                    sink_id=self.sink_id,
                    txn_id=txn_id,
                    checkpoint_id=checkpoint_id,
                    rows=rows,
                    precommitted_at=time.time(),
                )
            )
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

    def _insert_commit_record(self, conn: Connection, txn_id: str, rows: int, ckpt: int) -> bool:
        """INSERT ... ON CONFLICT DO NOTHING: the one serialization point between committers."""
        from sqlalchemy.dialects import postgresql, sqlite

        values = {
            "sink_id": self.sink_id,
            "txn_id": txn_id,
            "committed_at": time.time(),
            "rows": rows,
            "checkpoint_id": ckpt,
        }
        keys = ["sink_id", "txn_id"]
        statement: postgresql.Insert | sqlite.Insert
        if self.engine.dialect.name == "postgresql":
            statement = postgresql.insert(self._commits).values(values)
            statement = statement.on_conflict_do_nothing(index_elements=keys)
        else:
            statement = sqlite.insert(self._commits).values(values)
            statement = statement.on_conflict_do_nothing(index_elements=keys)
        return conn.execute(statement, execution_options=COUNT_ROWS).rowcount == 1

    def commit(self, txn: SinkTransaction) -> bool:
        """Record the commit and move the staged rows into the table, in one DB transaction."""
        txn_id = self._check_owned(txn)
        self._require_checkpoint(txn)
        self._ensure_bookkeeping()
        tables = self._data_tables()
        with self.engine.begin() as conn:
            # Lock the pre-commit row first: a racing commit or abort waits here, then finds it
            # gone and sees the winner's commit record.
            sealed = self._precommit_row(conn, txn_id, lock=True)
            if sealed is None:
                if self._commit_record_exists(conn, txn_id):
                    return False
                raise NotPrecommittedError(
                    f"sink {self.sink_id!r}: transaction {txn_id!r} has no pre-committed rows to "
                    "commit: it was never pre-committed or it was aborted"
                )
            checkpoint_id = txn.checkpoint_id if txn.checkpoint_id is not None else 0
            if not self._insert_commit_record(conn, txn_id, int(sealed.rows), checkpoint_id):
                return False
            moved = self._move_staged_rows(conn, tables, txn_id) if tables else 0
            if moved != sealed.rows:
                raise SinkTransactionError(
                    f"sink {self.sink_id!r}: transaction {txn_id!r} was pre-committed with "
                    f"{sealed.rows} rows but {moved} are staged; nothing was committed"
                )
            conn.execute(
                delete(self._precommits).where(
                    self._precommits.c.sink_id == self.sink_id,
                    self._precommits.c.txn_id == txn_id,
                )
            )
            conn.execute(
                update(self._commits)
                .where(self._commits.c.sink_id == self.sink_id, self._commits.c.txn_id == txn_id)
                .values(rows=moved)
            )
            self._forget_writes(conn, txn_id)
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
        self._ensure_bookkeeping()
        tables = self._data_tables()
        with self.engine.begin() as conn:
            self._precommit_row(conn, txn_id, lock=True)  # serialize with a racing commit
            if self._commit_record_exists(conn, txn_id):
                raise AlreadyCommittedError(self.sink_id, txn_id, "abort")
            if tables is not None:
                conn.execute(delete(tables[1]).where(tables[1].c[TXN_COLUMN] == txn_id))
            self._forget_writes(conn, txn_id)
            conn.execute(
                delete(self._precommits).where(
                    self._precommits.c.sink_id == self.sink_id,
                    self._precommits.c.txn_id == txn_id,
                )
            )

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
        url = self.engine.url.render_as_string(hide_password=True)
        return f"SqlTableSink(sink_id={self.sink_id!r}, url={url!r}, table={self.table_name!r})"


def estimated_bytes(df: pyspark.sql.DataFrame) -> int | None:
    """Spark's size estimate of a frame's optimized plan (no job runs; file sizes for a scan),
    or None where it is not available (Spark Connect).
    """
    try:
        return int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
    except Exception:
        return None


# -- executor side of write_spark ------------------------------------------------------------


@contextlib.contextmanager
def _local_executors_use_this_python(df: pyspark.sql.DataFrame) -> Iterator[None]:
    """On a ``local[*]`` master without ``PYSPARK_PYTHON``, PySpark starts its Python workers
    with whatever ``python3`` is first on PATH, which may lack this package and its database
    drivers. The staging UDF is then built with the driver's own interpreter (same machine, same
    packages). Any other master keeps its configuration: its executors need the package.
    """
    context: Any = getattr(df.sparkSession, "_sc", None)  # None on Spark Connect
    if (
        context is None
        or not str(context.master).startswith("local")
        or "PYSPARK_PYTHON" in os.environ
        or context.pythonExec == sys.executable
    ):
        yield
        return
    previous = context.pythonExec
    context.pythonExec = sys.executable
    try:
        yield
    finally:
        context.pythonExec = previous


@dataclass(frozen=True)
class _PartitionWrite:
    """What a Spark task needs to stage its partition (pickled into the task: the URL keeps its
    password, as for the sink itself).
    """

    url: str
    sink_id: str
    txn_id: str
    write_id: str
    staging_table: str
    columns: tuple[str, ...]

    def __call__(self, batches: Iterator[pyarrow.RecordBatch]) -> Iterator[pyarrow.RecordBatch]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        rows = _stage_partition(self, partition, batches)
        yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})


def _stage_partition(spec: _PartitionWrite, partition: int, batches: Iterator[Any]) -> int:
    """Stage one partition's rows in one database transaction that also claims the partition
    in ``finalckpt_sink_writes``: a retried or speculative task attempt whose partition is
    already claimed writes nothing and reports the claimed count, so no row is staged twice.
    """
    from sqlalchemy.pool import NullPool

    engine = make_engine(spec.url, poolclass=NullPool)
    if engine.dialect.name == "sqlite":
        # Partitions queue for SQLite's one write lock, each holding it for its whole insert:
        # wait longer than the coordinator's 60 s before "database is locked".
        def _long_busy_timeout(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute(f"PRAGMA busy_timeout={SQLITE_STAGING_BUSY_TIMEOUT_MS}")

        event.listen(engine, "connect", _long_busy_timeout)
    writes = _bookkeeping_metadata().tables[WRITES_TABLE]
    key = {
        "sink_id": spec.sink_id,
        "txn_id": spec.txn_id,
        "write_id": spec.write_id,
        "part": partition,
    }
    try:
        if engine.dialect.name == "sqlite":
            # Convert before taking SQLite's single write lock, to hold it as briefly as can be.
            statement, rows = _sqlite_rows(engine, spec, batches)
            with engine.begin() as conn:  # BEGIN IMMEDIATE: partitions queue on the busy timeout
                claimed = _claim(conn, writes, key)
                if claimed is not None:
                    return claimed
                if rows:
                    conn.exec_driver_sql(statement, rows)  # the DB-API's executemany
                _record_rows(conn, writes, key, len(rows))
                return len(rows)
        with engine.begin() as conn:
            claimed = _claim(conn, writes, key)
            if claimed is not None:
                for _ in batches:
                    pass
                return claimed
            count = _copy_into_postgres(conn, spec, batches)
            _record_rows(conn, writes, key, count)
            return count
    finally:
        engine.dispose()


def _sqlite_rows(
    engine: Engine, spec: _PartitionWrite, batches: Iterator[Any]
) -> tuple[str, list[tuple[Any, ...]]]:
    """The INSERT and its parameter tuples, converted column by column with the bind
    processors of the staging table's reflected types (what SQLAlchemy's own ``insert`` would
    apply, without its per-row dictionaries: about 3x faster).
    """
    staging = Table(spec.staging_table, MetaData(), autoload_with=engine)
    dialect = engine.dialect
    names = (TXN_COLUMN, *spec.columns)
    processors = [
        staging.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in names
    ]
    rows: list[tuple[Any, ...]] = []
    for batch in batches:
        batch = batch.select(list(spec.columns))
        if batch.num_rows == 0:
            continue
        columns = [[spec.txn_id] * batch.num_rows]
        columns += [batch.column(index).to_pylist() for index in range(batch.num_columns)]
        converted = [
            [process(value) for value in values] if process is not None else values
            for process, values in zip(processors, columns, strict=True)
        ]
        rows.extend(zip(*converted, strict=True))
    quoted = ", ".join(f'"{name}"' for name in names)
    marks = ", ".join("?" for _ in names)
    return f'INSERT INTO "{spec.staging_table}" ({quoted}) VALUES ({marks})', rows


def _claim(conn: Connection, writes: Table, key: dict[str, Any]) -> int | None:
    """Insert the partition's claim; None if claimed now, else the rows the claimant staged."""
    from sqlalchemy.dialects import postgresql, sqlite

    values = {**key, "rows": -1}
    statement: postgresql.Insert | sqlite.Insert
    if conn.dialect.name == "postgresql":
        statement = postgresql.insert(writes).values(values).on_conflict_do_nothing()
    else:
        statement = sqlite.insert(writes).values(values).on_conflict_do_nothing()
    if conn.execute(statement, execution_options=COUNT_ROWS).rowcount == 1:
        return None
    where = [writes.c[name] == value for name, value in key.items()]
    return int(conn.execute(select(writes.c.rows).where(*where)).scalar_one())


def _record_rows(conn: Connection, writes: Table, key: dict[str, Any], rows: int) -> None:
    where = [writes.c[name] == value for name, value in key.items()]
    conn.execute(update(writes).where(*where).values(rows=rows))


def _copy_into_postgres(conn: Connection, spec: _PartitionWrite, batches: Iterator[Any]) -> int:
    """``COPY ... FROM STDIN`` in CSV written by pyarrow's C++ writer (rows one by one through
    psycopg only for binary columns, which CSV cannot carry).
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.types as pat

    names = ", ".join(f'"{name}"' for name in (TXN_COLUMN, *spec.columns))
    driver = conn.connection.driver_connection
    assert driver is not None
    count = 0
    options = pacsv.WriteOptions(include_header=False)
    statement = f'COPY "{spec.staging_table}" ({names}) FROM STDIN (FORMAT csv)'
    with driver.cursor() as cursor, cursor.copy(statement) as copy:
        for batch in batches:
            batch = batch.select(list(spec.columns))
            if batch.num_rows == 0:
                continue
            count += batch.num_rows
            txn = pa.array([spec.txn_id] * batch.num_rows, pa.string())
            table = pa.Table.from_batches([batch]).add_column(0, TXN_COLUMN, txn)
            if any(pat.is_binary(f.type) or pat.is_large_binary(f.type) for f in table.schema):
                for row in zip(*(column.to_pylist() for column in table.columns), strict=True):
                    copy.write_row(row)
                continue
            sink = pa.BufferOutputStream()
            pacsv.write_csv(table, sink, options)
            copy.write(sink.getvalue().to_pybytes())
    return count
