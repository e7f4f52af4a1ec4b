"""The executor side of ``SqlTableSink.write_spark``: each Spark task stages its partition.

A task opens its own connection and bulk-loads its partition (PostgreSQL ``COPY``, SQLite
``executemany``) in one database transaction that also claims the partition in
``finalckpt_sink_writes``, so a retried or speculative attempt stages nothing twice, and that
first holds the write's open row, so a task still running after its job failed and its
transaction was aborted stages nothing (see ``WRITE_OPEN``). Nothing here
needs the sink object: what a task needs travels in a picklable ``PartitionWrite``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, MetaData, Table, event, select, update

from airflow_finalckpt.sinks.base import SinkTransactionError
from airflow_finalckpt.sinks.sql_tables import (
    COUNT_ROWS,
    TXN_COLUMN,
    WRITE_OPEN,
    WRITES_TABLE,
    bookkeeping_metadata,
    insert_or_nothing,
)
from airflow_finalckpt.store.engine import make_engine

if TYPE_CHECKING:
    import pyarrow
    import pyspark.sql
    from sqlalchemy import Connection

#: How long a Spark task waits for SQLite's write lock while other partitions are staged.
SQLITE_STAGING_BUSY_TIMEOUT_MS = 30 * 60 * 1000


def estimated_bytes(df: pyspark.sql.DataFrame) -> int | None:
    """Spark's size estimate of a frame's optimized plan (no job runs; file sizes for a scan),
    or None where it is not available (Spark Connect).
    """
    try:
        return int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
    except Exception:
        return None


@contextlib.contextmanager
def local_executors_use_this_python(df: pyspark.sql.DataFrame) -> Iterator[None]:
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
class PartitionWrite:
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
        """The ``mapInArrow`` function: stage this task's partition, yield its row count."""
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        rows = stage_partition(self, partition, batches)
        yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})


def stage_partition(spec: PartitionWrite, partition: int, batches: Iterator[Any]) -> int:
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
    writes = bookkeeping_metadata().tables[WRITES_TABLE]
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
                _hold_open_write(conn, writes, key)
                claimed = _claim(conn, writes, key)
                if claimed is not None:
                    return claimed
                if rows:
                    conn.exec_driver_sql(statement, rows)  # the DB-API's executemany
                _record_rows(conn, writes, key, len(rows))
                return len(rows)
        with engine.begin() as conn:
            _hold_open_write(conn, writes, key)
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
    engine: Engine, spec: PartitionWrite, batches: Iterator[Any]
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


def _hold_open_write(conn: Connection, writes: Table, key: dict[str, Any]) -> None:
    """Hold the write's open row (FOR SHARE) until the partition's transaction ends; refuse to
    stage once it is gone (the transaction was aborted, or committed).
    """
    where = [writes.c[name] == key[name] for name in ("sink_id", "txn_id", "write_id")]
    query = select(writes.c.rows).where(*where, writes.c.part == WRITE_OPEN)
    if conn.execute(query.with_for_update(read=True)).first() is None:
        raise SinkTransactionError(
            f"sink {key['sink_id']!r}: transaction {key['txn_id']!r} has no open write "
            f"{key['write_id']!r} (aborted or committed); partition {key['part']} staged nothing"
        )


def _claim(conn: Connection, writes: Table, key: dict[str, Any]) -> int | None:
    """Insert the partition's claim; None if claimed now, else the rows the claimant staged."""
    statement = insert_or_nothing(conn.dialect.name, writes, {**key, "rows": -1})
    if conn.execute(statement, execution_options=COUNT_ROWS).rowcount == 1:
        return None
    where = [writes.c[name] == value for name, value in key.items()]
    return int(conn.execute(select(writes.c.rows).where(*where)).scalar_one())


def _record_rows(conn: Connection, writes: Table, key: dict[str, Any], rows: int) -> None:
    where = [writes.c[name] == value for name, value in key.items()]
    conn.execute(update(writes).where(*where).values(rows=rows))


def _copy_into_postgres(conn: Connection, spec: PartitionWrite, batches: Iterator[Any]) -> int:
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
