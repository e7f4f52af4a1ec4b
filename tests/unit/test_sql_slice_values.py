"""A SQL sink's ``replace_slice`` values arrive as strings (rendered templates): the delete of
the old slice compares them as their columns' types, so PostgreSQL has no ``date = varchar``
to refuse at commit; a value that is not of its column's type fails with one line."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest
from sqlalchemy import BigInteger, Column, Date, DateTime, Numeric, String, Uuid

from airflow_finalckpt.sinks.base import SinkError
from airflow_finalckpt.sinks.sql_tables import slice_value


@pytest.mark.parametrize(
    ("column", "dialect", "want"),
    [
        (Column("d", Date), "postgresql", datetime.date(2024, 1, 2)),
        (Column("d", Date), "sqlite", datetime.date(2024, 1, 2)),
        (Column("t", DateTime), "postgresql", datetime.datetime(2024, 1, 2)),
        (Column("t", DateTime), "sqlite", "2024-01-02"),  # SQLite keeps its own text form
        (Column("s", String), "postgresql", "2024-01-02"),
    ],
)
def test_a_date_string_is_compared_as_its_column(
    column: Column[Any], dialect: str, want: object
) -> None:
    assert slice_value(column, "2024-01-02", dialect) == want


def test_numbers_and_values_already_typed() -> None:
    assert slice_value(Column("h", BigInteger), "7", "postgresql") == 7
    assert slice_value(Column("p", Numeric), "1.5", "postgresql") == decimal.Decimal("1.5")
    assert slice_value(Column("h", BigInteger), 7, "postgresql") == 7
    assert slice_value(Column("u", Uuid), "x", "postgresql") == "x"  # no parser: as it is


def test_a_value_of_another_type_fails_with_one_line() -> None:
    with pytest.raises(SinkError, match="'tomorrow' does not parse as the DATE of column 'd'"):
        slice_value(Column("d", Date), "tomorrow", "postgresql")
    with pytest.raises(SinkError, match="nothing was committed"):
        slice_value(Column("h", BigInteger), "7a", "postgresql")
