"""The plain parts the SQL and Parquet sinks are built from, on their own: column types, name
checks and table definitions (sql_tables), and the crash-safe file operations (parquet_files) on
a local disk and on fsspec's in-memory filesystem (an object-store stand-in)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import BigInteger, Boolean, DateTime, Integer, Numeric, Text, create_engine, insert

from airflow_finalckpt.core.errors import ConfigurationError
from airflow_finalckpt.sinks import InvalidIdentifierError, SinkError
from airflow_finalckpt.sinks.parquet_files import MANIFEST_FORMAT, TableFiles, is_hidden
from airflow_finalckpt.sinks.sql_tables import (
    TXN_COLUMN,
    bookkeeping_metadata,
    check_column_name,
    check_table_name,
    column_definitions,
    create_tables,
    define_staging,
    define_target,
    insert_or_nothing,
    reflect_staging,
    sql_type_for_arrow,
)

# ------------------------------------------------------------------------------ sql_tables


@pytest.mark.parametrize(
    ("arrow_type", "sql_type"),
    [
        (pa.bool_(), Boolean),
        (pa.int8(), Integer),
        (pa.uint16(), Integer),
        (pa.int32(), Integer),
        (pa.int64(), BigInteger),
        (pa.uint32(), BigInteger),
        (pa.string(), Text),
        (pa.null(), Text),
    ],
)
def test_arrow_types_map_to_the_narrowest_sql_type(arrow_type: pa.DataType, sql_type: type) -> None:
    assert type(sql_type_for_arrow(arrow_type)) is sql_type


def test_decimals_and_timestamps_keep_their_parameters() -> None:
    decimal = sql_type_for_arrow(pa.decimal128(12, 3))
    assert isinstance(decimal, Numeric) and (decimal.precision, decimal.scale) == (12, 3)
    aware = sql_type_for_arrow(pa.timestamp("us", "UTC"))
    naive = sql_type_for_arrow(pa.timestamp("us"))
    assert isinstance(aware, DateTime) and aware.timezone is True
    assert isinstance(naive, DateTime) and naive.timezone is False


def test_an_arrow_type_without_a_sql_column_type_is_a_clear_error() -> None:
    with pytest.raises(SinkError, match=r"no SQL column type for Arrow type list<.*columns="):
        sql_type_for_arrow(pa.list_(pa.int64()))


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a" * 55, "x;drop", None])
def test_unsafe_table_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidIdentifierError, match="invalid table name"):
        check_table_name(name)


def test_the_transaction_column_name_is_reserved() -> None:
    assert check_column_name("a" * 63) == "a" * 63
    with pytest.raises(InvalidIdentifierError, match="reserved"):
        check_column_name(TXN_COLUMN)
    with pytest.raises(InvalidIdentifierError, match="invalid column name"):
        check_column_name("a b")


def test_declared_columns_win_over_the_arrow_schema() -> None:
    schema = pa.schema([("id", pa.int64())])
    assert column_definitions(None, None) is None
    from_schema = column_definitions(None, schema)
    assert from_schema is not None and isinstance(from_schema["id"], BigInteger)
    declared = column_definitions({"id": Integer, "name": Text()}, schema)
    assert declared is not None and list(declared) == ["id", "name"]
    assert isinstance(declared["id"], Integer) and isinstance(declared["name"], Text)


def test_key_columns_are_the_targets_primary_key_and_the_staging_twin_is_nullable() -> None:
    target = define_target("orders", {"id": BigInteger(), "v": Text()}, ("id",))
    assert [c.name for c in target.primary_key.columns] == ["id"]
    assert target.c.id.nullable is False and target.c.v.nullable is True
    staging = define_staging(target)
    assert staging.name == "orders__staging"
    assert list(staging.columns.keys()) == [TXN_COLUMN, "id", "v"]
    assert staging.c.id.nullable is True and staging.c[TXN_COLUMN].nullable is False
    with pytest.raises(ConfigurationError, match=r"key columns \['nope'\] are not in the data"):
        define_target("orders", {"id": BigInteger()}, ("nope",))


def test_a_staging_table_of_another_schema_is_refused(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    old = define_staging(define_target("orders", {"id": BigInteger()}, ()))
    create_tables(engine, old.metadata)
    create_tables(engine, old.metadata)  # again: already there is fine
    wider = define_target("orders", {"id": BigInteger(), "v": Text()}, ())
    with pytest.raises(SinkError, match=r"lacks columns \['v'\]; drop it"):
        reflect_staging(engine, "orders__staging", wider)
    same = reflect_staging(
        engine, "orders__staging", define_target("orders", {"id": BigInteger()}, ())
    )
    assert set(same.columns.keys()) == {TXN_COLUMN, "id"}
    engine.dispose()


def test_insert_or_nothing_lets_the_first_insert_win(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    commits = bookkeeping_metadata().tables["finalckpt_sink_commits"]
    create_tables(engine, commits.metadata)
    row = {"sink_id": "s", "txn_id": "t", "committed_at": 1.0, "rows": 3, "checkpoint_id": 1}
    with engine.begin() as conn:
        first = conn.execute(insert_or_nothing("sqlite", commits, row, ["sink_id", "txn_id"]))
        again = conn.execute(
            insert_or_nothing("sqlite", commits, {**row, "rows": 9}, ["sink_id", "txn_id"])
        )
        assert (first.rowcount, again.rowcount) == (1, 0)
        assert conn.execute(commits.select()).mappings().one()["rows"] == 3
        conn.execute(insert(commits).values({**row, "txn_id": "u"}))  # other keys still insert
    engine.dispose()


# ------------------------------------------------------------------------------ parquet_files


@pytest.fixture(params=["local", "memory"])
def files(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TableFiles, str]]:
    if request.param == "local":
        yield TableFiles(fsspec.filesystem("file"), "s1"), str(tmp_path)
        return
    fs = fsspec.filesystem("memory")
    root = f"/parts-{uuid.uuid4().hex}"
    fs.makedirs(root, exist_ok=True)
    yield TableFiles(fs, "s1"), root
    fs.rm(root, recursive=True)


def test_hidden_paths_are_the_ones_spark_and_pyarrow_skip() -> None:
    assert is_hidden("_SUCCESS") and is_hidden("a/.part.crc") and is_hidden("_temporary/0/x")
    assert not is_hidden("part-0.parquet") and not is_hidden("day=1/part-0.parquet")


def test_create_exclusively_creates_once(files: tuple[TableFiles, str]) -> None:
    table, root = files
    path = f"{root}/txn-a/_manifest.json"
    table.fs.makedirs(f"{root}/txn-a", exist_ok=True)
    assert table.create_exclusively(path, b"first") is True
    assert table.create_exclusively(path, b"second") is False
    assert table.fs.cat_file(path) == b"first"
    assert table.list_names(f"{root}/txn-a") == ["_manifest.json"]  # no temporary file left
    assert table.list_names(f"{root}/missing") == []


def test_write_atomically_replaces_the_whole_content(files: tuple[TableFiles, str]) -> None:
    table, root = files
    path = f"{root}/m.json"
    table.write_atomically(path, b"old")
    table.write_atomically(path, b"new content")
    assert table.fs.cat_file(path) == b"new content" and table.exists(path)
    assert table.list_names(root) == ["m.json"]


def test_read_manifest_refuses_other_formats_and_bad_json(files: tuple[TableFiles, str]) -> None:
    table, root = files
    table.write_atomically(f"{root}/ok.json", b'{"format": %d, "rows": 2}' % MANIFEST_FORMAT)
    assert table.read_manifest(f"{root}/ok.json")["rows"] == 2
    table.write_atomically(f"{root}/v9.json", b'{"format": 9}')
    with pytest.raises(SinkError, match=r"sink 's1'.*is not a format-1 manifest"):
        table.read_manifest(f"{root}/v9.json")
    table.write_atomically(f"{root}/bad.json", b"{nope")
    with pytest.raises(SinkError, match="is not valid JSON"):
        table.read_manifest(f"{root}/bad.json")


def test_data_files_and_row_counts_skip_hidden_files(files: tuple[TableFiles, str]) -> None:
    table, root = files
    staging = f"{root}/_staging/t1"
    table.fs.makedirs(f"{staging}/_temporary", exist_ok=True)
    with table.fs.open(f"{staging}/part-0.parquet", "wb") as handle:
        pq.write_table(pa.table({"id": [1, 2, 3]}), handle)
    table.fs.pipe_file(f"{staging}/_SUCCESS", b"")
    table.fs.pipe_file(f"{staging}/_temporary/part-9.parquet", b"half")
    found = table.data_files(staging)
    assert list(found) == ["part-0.parquet"] and found["part-0.parquet"] > 0
    assert table.row_count(f"{staging}/part-0.parquet") == 3
    with pytest.raises(SinkError, match="not a readable Parquet file"):
        table.row_count(f"{staging}/_temporary/part-9.parquet")


def test_copy_files_copies_only_missing_or_torn_targets(files: tuple[TableFiles, str]) -> None:
    table, root = files
    table.fs.makedirs(f"{root}/src", exist_ok=True)
    table.fs.pipe_file(f"{root}/src/a", b"aaaa")
    table.fs.pipe_file(f"{root}/src/b", b"bbbb")
    table.fs.makedirs(f"{root}/dst/sub", exist_ok=True)
    table.fs.pipe_file(f"{root}/dst/a", b"AAAA")  # same size: taken as already copied
    table.fs.pipe_file(f"{root}/dst/sub/b", b"b")  # torn: copied again
    table.copy_files([f"{root}/src/a", f"{root}/src/b"], [f"{root}/dst/a", f"{root}/dst/sub/b"])
    assert table.fs.cat_file(f"{root}/dst/a") == b"AAAA"
    assert table.fs.cat_file(f"{root}/dst/sub/b") == b"bbbb"
    assert table.list_names(f"{root}/dst/sub") == ["b"]
    with pytest.raises(FileNotFoundError):
        table.copy_files([f"{root}/src/gone"], [f"{root}/dst/gone"])
