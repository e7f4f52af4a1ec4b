"""The SQL sink's tables, as plain functions over names and types.

The bookkeeping tables every SQL sink shares (commit records, pre-commit seals, Spark partition
writes), the target table and its staging twin defined from declared columns or an Arrow schema,
the checks that keep every name safe to use unquoted, and the one dialect-specific statement
(``INSERT ... ON CONFLICT DO NOTHING``) that serializes concurrent committers.
"""

from __future__ import annotations

import datetime
import decimal
import os
import re
from collections.abc import Callable, Mapping
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
    and_,
    event,
    inspect,
)
from sqlalchemy.exc import DatabaseError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeEngine

from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.sinks.base import InvalidIdentifierError, SinkError

if TYPE_CHECKING:
    import pyarrow
    from sqlalchemy.dialects import postgresql, sqlite

COMMITS_TABLE = "finalckpt_sink_commits"
PRECOMMITS_TABLE = "finalckpt_sink_precommits"
#: Partitions staged by ``write_spark`` (part >= 0), completed writes (part = WRITE_DONE) and
#: writes in progress (part = WRITE_OPEN): a partition stages rows only while its write's open
#: row exists, and an abort deletes it, so the tasks of a failed job that still run when the
#: transaction is aborted stage nothing after it.
WRITES_TABLE = "finalckpt_sink_writes"
WRITE_DONE = -1
WRITE_OPEN = -2
STAGING_SUFFIX = "__staging"
TXN_COLUMN = "finalckpt_txn_id"
ID_TYPE = String(200)

#: Unquoted-safe SQL names; 54 characters leaves room for the suffix within PostgreSQL's 63.
SAFE_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,53}")
SAFE_COLUMN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

SUPPORTED_DIALECTS = ("postgresql", "sqlite")

#: Without it SQLAlchemy 2.1 on psycopg reports rowcount -1 for INSERTs; the counts matter here.
COUNT_ROWS = {"preserve_rowcount": True}


def bookkeeping_metadata() -> MetaData:
    """The three bookkeeping tables, shared by every SQL sink in a database (keyed by sink id)."""
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


def _arrow_type_rules() -> list[tuple[tuple[str, ...], Callable[[Any], TypeEngine[Any]]]]:
    """(pyarrow.types predicates, SQL type or a function of the Arrow type), first match wins."""
    return [
        (("is_boolean",), lambda _: Boolean()),
        (("is_int8", "is_int16", "is_uint8", "is_int32", "is_uint16"), lambda _: Integer()),
        (("is_integer",), lambda _: BigInteger()),
        (("is_float16", "is_float32"), lambda _: Float()),
        (("is_float64",), lambda _: Double()),
        (("is_decimal",), lambda t: Numeric(t.precision, t.scale)),
        (("is_string", "is_large_string", "is_null"), lambda _: Text()),
        (("is_binary", "is_large_binary"), lambda _: LargeBinary()),
        (("is_timestamp",), lambda t: DateTime(timezone=t.tz is not None)),
        (("is_date",), lambda _: Date()),
    ]


def sql_type_for_arrow(arrow_type: pyarrow.DataType) -> TypeEngine[Any]:
    """The column type a new table gets for an Arrow (or pandas) column type."""
    import pyarrow.types as pat

    for predicates, make in _arrow_type_rules():
        if any(getattr(pat, predicate)(arrow_type) for predicate in predicates):
            return make(arrow_type)
    raise SinkError(
        f"no SQL column type for Arrow type {arrow_type}; pass columns= explicitly to SqlTableSink"
    )


def check_table_name(name: str) -> str:
    """The name, if it is safe unquoted and leaves room for the staging suffix."""
    if not isinstance(name, str) or SAFE_TABLE_NAME.fullmatch(name) is None:
        raise InvalidIdentifierError(
            f"invalid table name {name!r}: use 1-54 ASCII letters, digits or '_', "
            "not starting with a digit"
        )
    return name


def check_column_name(name: str) -> str:
    """The name, if it is safe unquoted and not the sink's own transaction column."""
    if not isinstance(name, str) or SAFE_COLUMN_NAME.fullmatch(name) is None:
        raise InvalidIdentifierError(f"invalid column name {name!r}")
    if name == TXN_COLUMN:
        raise InvalidIdentifierError(f"column name {TXN_COLUMN!r} is reserved by the sink")
    return name


def create_tables(engine: Engine, metadata: MetaData) -> None:
    """CREATE tables if missing; another process creating them at the same time is fine."""
    try:
        metadata.create_all(engine, checkfirst=True)
    except DatabaseError:
        names = set(inspect(engine).get_table_names())
        if not set(metadata.tables) <= names:
            raise


def column_definitions(
    columns: dict[str, TypeEngine[Any] | type[TypeEngine[Any]]] | None,
    arrow_schema: pyarrow.Schema | None,
) -> dict[str, TypeEngine[Any]] | None:
    """A new table's column types: the declared ``columns``, else from ``arrow_schema``; None
    when neither is known yet.
    """
    if columns is not None:
        return {name: kind() if isinstance(kind, type) else kind for name, kind in columns.items()}
    if arrow_schema is None:
        return None
    return {check_column_name(field.name): sql_type_for_arrow(field.type) for field in arrow_schema}


def define_target(
    table_name: str, definitions: dict[str, TypeEngine[Any]], key_columns: tuple[str, ...]
) -> Table:
    """The target table; its key columns (if any) are its primary key and NOT NULL."""
    missing_keys = set(key_columns) - set(definitions)
    if missing_keys:
        raise ConfigurationError(f"key columns {sorted(missing_keys)} are not in the data")
    columns = [
        Column(name, kind, nullable=name not in key_columns) for name, kind in definitions.items()
    ]
    constraints = [PrimaryKeyConstraint(*key_columns)] if key_columns else []
    return Table(table_name, MetaData(), *columns, *constraints)


def define_staging(target: Table) -> Table:
    """The staging twin of ``target``: every column nullable, plus the transaction id."""
    columns = [Column(column.name, column.type, nullable=True) for column in target.columns]
    return Table(
        target.name + STAGING_SUFFIX,
        MetaData(),
        Column(TXN_COLUMN, ID_TYPE, nullable=False, index=True),
        *columns,
    )


def reflect_staging(engine: Engine, name: str, target: Table) -> Table:
    """An existing staging table, refused if it lacks a column of the target (it was made for
    another schema): it holds only uncommitted rows, so dropping it is the fix.
    """
    staging = Table(name, MetaData(), autoload_with=engine)
    missing = {c.name for c in target.columns} - {c.name for c in staging.columns}
    if missing or TXN_COLUMN not in staging.columns:
        raise SinkError(
            f"staging table {name!r} lacks columns "
            f"{sorted(missing | ({TXN_COLUMN} - set(staging.columns.keys())))}; "
            "drop it (it holds only uncommitted rows) to let the sink recreate it"
        )
    return staging


def insert_or_nothing(
    dialect_name: str, table: Table, values: dict[str, Any], index_elements: list[str] | None = None
) -> postgresql.Insert | sqlite.Insert:
    """``INSERT ... ON CONFLICT DO NOTHING`` in the dialect's spelling: whoever inserts the row
    first wins, the others see rowcount 0.
    """
    from sqlalchemy.dialects import postgresql, sqlite

    if dialect_name == "postgresql":
        pg = postgresql.insert(table).values(values)
        return pg.on_conflict_do_nothing(index_elements=index_elements)
    lite = sqlite.insert(table).values(values)
    return lite.on_conflict_do_nothing(index_elements=index_elements)


def guard_sqlite_directory(sink_id: str, engine: Engine) -> None:
    """A SQLite file's directory must exist when the sink first connects (SQLite creates the
    file, not its directory); checked then, not when the DAG is parsed, because the DAG
    processor may run where that directory does not exist (or before a task creates it).
    """
    database = engine.url.database or ""
    if engine.dialect.name != "sqlite" or database in ("", ":memory:"):
        return
    directory = os.path.dirname(os.path.abspath(database))

    @event.listens_for(engine, "do_connect")
    def _check(*_args: Any) -> None:
        if not os.path.isdir(directory):
            raise ConfigurationError(
                f"sink {sink_id!r}: argument url: the SQLite file's directory {directory} does "
                "not exist; create it or point url at an existing directory"
            )


def slice_value(column: Column[Any], value: Any, dialect: str) -> Any:
    """A ``replace_slice`` value (a rendered template, so a string) as its column's Python
    type: PostgreSQL compares no ``date`` or ``bigint`` with ``varchar`` (SQLite compares by
    affinity and keeps its own text form of timestamps, so those stay strings there).
    """
    try:
        python_type = column.type.python_type
    except NotImplementedError:
        return value
    if not isinstance(value, str) or python_type is str:
        return value
    parse: Callable[[str], Any] | None = None
    if python_type is datetime.datetime and dialect != "sqlite":
        parse = datetime.datetime.fromisoformat
    elif python_type is datetime.date:
        parse = datetime.date.fromisoformat
    elif python_type in (int, float, decimal.Decimal):
        parse = python_type
    if parse is None:
        return value
    try:
        return parse(value)
    except (ValueError, decimal.InvalidOperation) as exc:
        raise SinkError(
            f"replace_slice value {value!r} does not parse as the {column.type} of column "
            f"{column.name!r} ({exc}); nothing was committed"
        ) from exc


def in_slice(target: Table, replace_slice: Mapping[str, Any], dialect: str) -> ColumnElement[bool]:
    """The rows of ``target`` in the slice, each value compared as its column's type."""
    return and_(
        *(target.c[c] == slice_value(target.c[c], v, dialect) for c, v in replace_slice.items())
    )
