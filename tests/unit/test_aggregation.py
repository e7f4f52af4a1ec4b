"""The merge algebra of incremental aggregates (core.aggregation): declarations are checked
before any Spark work, each aggregate keeps the partials that merge associatively."""

from __future__ import annotations

import pytest

from airflow_finalckpt.core.aggregation import (
    ROWS_PARTIAL,
    AggregateError,
    AggregateKind,
    AggregateSpec,
    Merge,
    check_declaration,
    distinct_column,
    missing_columns,
    state_columns,
)

COUNT = AggregateSpec(AggregateKind.COUNT)
SUM = AggregateSpec(AggregateKind.SUM, "amount")
MEAN = AggregateSpec(AggregateKind.MEAN, "amount")
FIRST = AggregateSpec(AggregateKind.FIRST, "amount", "ts")
DISTINCT = AggregateSpec(AggregateKind.COUNT_DISTINCT, "user")


def test_state_columns_are_keys_rows_then_each_partial() -> None:
    aggs = {"n": COUNT, "avg": MEAN, "first": FIRST, "users": DISTINCT}
    assert state_columns(["day"], aggs) == [
        "day",
        ROWS_PARTIAL,
        "n__count",
        "avg__sum",
        "avg__count",
        "first__value",
        "first__order",
        "users__distinct",
    ]


def test_merges_are_associative_operations() -> None:
    assert [p.merge for p in MEAN.parts] == [Merge.SUM, Merge.SUM]
    assert [(p.merge, p.by) for p in FIRST.parts] == [(Merge.MIN_BY, "order"), (Merge.MIN, None)]
    last = AggregateSpec(AggregateKind.LAST, "amount", "ts")
    assert [(p.merge, p.by) for p in last.parts] == [(Merge.MAX_BY, "order"), (Merge.MAX, None)]
    assert DISTINCT.parts == () and DISTINCT.keeps_distinct
    assert FIRST.input_columns == ("amount", "ts")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: AggregateSpec(AggregateKind.SUM), "sum needs a column"),
        (lambda: AggregateSpec(AggregateKind.FIRST, "x"), r"first\('x'\) needs an ordering"),
        (lambda: AggregateSpec(AggregateKind.MIN, "x", "ts"), "min takes no ordering column"),
    ],
)
def test_a_wrong_aggregate_is_refused(make: object, message: str) -> None:
    with pytest.raises(AggregateError, match=message):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("name", "keys", "aggs", "message"),
    [
        ("to tals", ["k"], {"n": COUNT}, "must be a plain identifier"),
        ("t", "k", {"n": COUNT}, "keys must be a list"),
        ("t", [], {"n": COUNT}, "at least one column .*lit\\(1\\)"),
        ("t", ["k", "k"], {"n": COUNT}, "duplicate key columns"),
        ("t", ["k"], {}, "at least one aggregate"),
        ("t", ["k"], {"n__x": COUNT}, "without '__'"),
        ("t", ["n"], {"n": COUNT}, "clash with key columns"),
        ("t", [ROWS_PARTIAL], {"n": COUNT}, "reserved"),
        ("t", [distinct_column("u")], {"u": DISTINCT}, "reserved"),
    ],
)
def test_a_wrong_declaration_is_refused(
    name: str, keys: list[str], aggs: dict[str, AggregateSpec], message: str
) -> None:
    with pytest.raises(AggregateError, match=message):
        check_declaration(name, keys, aggs)


def test_missing_columns_lists_keys_values_and_orderings() -> None:
    aggs = {"first": FIRST, "users": DISTINCT}
    assert missing_columns(["day", "amount"], ["day", "key"], aggs) == ["key", "ts", "user"]
    assert missing_columns(["key", "amount", "ts", "user"], ["key"], aggs) == []
