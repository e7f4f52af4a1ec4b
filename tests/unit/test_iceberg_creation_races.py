"""Concurrent first runs race to create an Iceberg catalog's tables, the namespace and the table
(``sinks/iceberg_tables.after_creation_races``, tenacity): a loser tries again and loads what the
winner created; any other error is raised at once; the attempts are bounded."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_finalckpt.sinks import IcebergTableSink
from airflow_finalckpt.sinks.iceberg_tables import CREATE_ATTEMPTS, after_creation_races
from tests.extras import import_extra

iceberg_errors = import_extra("pyiceberg.exceptions", "lakehouse")
TableAlreadyExistsError = iceberg_errors.TableAlreadyExistsError
NoSuchTableError = iceberg_errors.NoSuchTableError


def flaky(failures: list[BaseException]) -> tuple[list[int], object]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return "loaded"

    return calls, call


def test_a_lost_race_is_tried_again() -> None:
    calls, call = flaky([TableAlreadyExistsError("db.t"), TableAlreadyExistsError("db.t")])
    assert after_creation_races(call) == "loaded"  # type: ignore[arg-type]
    assert len(calls) == 3


def test_the_attempts_are_bounded() -> None:
    calls, call = flaky([TableAlreadyExistsError("db.t")] * (CREATE_ATTEMPTS + 1))
    with pytest.raises(TableAlreadyExistsError):
        after_creation_races(call)  # type: ignore[arg-type]
    assert len(calls) == CREATE_ATTEMPTS


def test_another_error_is_raised_at_once() -> None:
    calls, call = flaky([NoSuchTableError("db.t")])
    with pytest.raises(NoSuchTableError):
        after_creation_races(call)  # type: ignore[arg-type]
    assert len(calls) == 1


def test_concurrent_first_writers_all_get_the_one_table(tmp_path: Path) -> None:
    """Real pyiceberg, SQLite catalog: four first writers create one new table at once."""
    writers = 4
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def first_batch(k: int) -> None:
        sink = IcebergTableSink(f"w{k}", "db.orders", warehouse=str(tmp_path / "warehouse"))
        barrier.wait()
        try:
            sink.write_arrow(f"t{k}", pa.table({"id": pa.array([k], pa.int64())}))
        except BaseException as exc:  # the outcome under test
            errors.append(exc)

    threads = [threading.Thread(target=first_batch, args=(k,)) for k in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    table = IcebergTableSink("reader", "db.orders", warehouse=str(tmp_path / "warehouse")).table()
    assert table is not None and [f.name for f in table.schema().fields] == ["id"]
