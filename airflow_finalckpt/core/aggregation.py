"""The merge algebra of incremental aggregates: what partial each aggregate keeps, how two
partials merge, what the final value is. Pure rules over names; ``spark.aggregate`` runs them.

An aggregate over a whole input equals the merge of its partials over any cut of the input into
batches (in any order) only if its partials form a commutative monoid: count and sum add, min and
max keep the extreme, a mean is a sum and a count divided at the end, first/last by an ordering
column keep the value at the smallest/largest ordering value seen, and an exact distinct count
keeps the distinct values themselves (the only partial that grows with the data).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

#: The hidden partial counting every key's rows: the keys a batch saw, whatever the aggregates.
ROWS_PARTIAL = "__rows"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class AggregateError(ValueError):
    """An incremental aggregate is declared wrong (names, keys, columns)."""


class AggregateKind(StrEnum):
    """An aggregate function the incremental aggregation keeps right across batches."""

    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    MEAN = "mean"
    COUNT_DISTINCT = "count_distinct"
    FIRST = "first"
    LAST = "last"


class Merge(StrEnum):
    """How two partials of one part combine (``*_BY``: the value at the extreme of ``by``)."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"
    MIN_BY = "min_by"
    MAX_BY = "max_by"


@dataclass(frozen=True)
class Part:
    """One partial column: its suffix, its merge, and for ``*_BY`` the part it is ordered by."""

    suffix: str
    merge: Merge
    by: str | None = None


_PARTS: dict[AggregateKind, tuple[Part, ...]] = {
    AggregateKind.COUNT: (Part("count", Merge.SUM),),
    AggregateKind.SUM: (Part("sum", Merge.SUM),),
    AggregateKind.MIN: (Part("min", Merge.MIN),),
    AggregateKind.MAX: (Part("max", Merge.MAX),),
    AggregateKind.MEAN: (Part("sum", Merge.SUM), Part("count", Merge.SUM)),
    # kept as distinct (key, value) rows of the state, no partial column
    AggregateKind.COUNT_DISTINCT: (),
    AggregateKind.FIRST: (Part("value", Merge.MIN_BY, by="order"), Part("order", Merge.MIN)),
    AggregateKind.LAST: (Part("value", Merge.MAX_BY, by="order"), Part("order", Merge.MAX)),
}


@dataclass(frozen=True)
class AggregateSpec:
    """One aggregate: ``kind`` over ``column`` (None: count rows), ``by`` for first/last.

    Nulls are ignored as in SQL: ``count(column)`` counts non-null values, a sum, mean, min or
    max of only nulls is null; first/last skip rows whose ordering value is null.
    """

    kind: AggregateKind
    column: str | None = None
    by: str | None = None

    def __post_init__(self) -> None:
        if self.kind is not AggregateKind.COUNT and self.column is None:
            raise AggregateError(f"{self.kind} needs a column")
        ordered = self.kind in (AggregateKind.FIRST, AggregateKind.LAST)
        if ordered and not self.by:
            raise AggregateError(f"{self.kind}({self.column!r}) needs an ordering column (by=)")
        if not ordered and self.by is not None:
            raise AggregateError(f"{self.kind} takes no ordering column (by={self.by!r})")

    @property
    def parts(self) -> tuple[Part, ...]:
        """The partial columns it keeps in the main state (none for a distinct count)."""
        return _PARTS[self.kind]

    @property
    def keeps_distinct(self) -> bool:
        """Whether it keeps its distinct (key, value) pairs as rows of the state."""
        return self.kind is AggregateKind.COUNT_DISTINCT

    @property
    def input_columns(self) -> tuple[str, ...]:
        """The input columns it reads."""
        return tuple(c for c in (self.column, self.by) if c is not None)


def partial_column(name: str, suffix: str) -> str:
    """The state column of one part (by its suffix) of the aggregate ``name``."""
    return f"{name}__{suffix}"


def state_columns(keys: Sequence[str], aggregates: Mapping[str, AggregateSpec]) -> list[str]:
    """The state's columns, in order: keys, the row count, every aggregate's partials, a value
    column per distinct count. A key's partial row has every value column null; a distinct
    (key, value) pair is a row of its own with its partials null and a row count of 0.
    """
    partials = [partial_column(n, p.suffix) for n, spec in aggregates.items() for p in spec.parts]
    distinct = [distinct_column(n) for n, spec in aggregates.items() if spec.keeps_distinct]
    return [*keys, ROWS_PARTIAL, *partials, *distinct]


def distinct_column(aggregate: str) -> str:
    """The distinct state's value column of one distinct count."""
    return f"{aggregate}__distinct"


def check_declaration(
    name: str, keys: Sequence[str], aggregates: Mapping[str, AggregateSpec]
) -> None:
    """Refuse a declaration whose state could not be written or read back unambiguously."""
    if not _NAME.match(name):
        raise AggregateError(f"incremental aggregate name {name!r} must be a plain identifier")
    if isinstance(keys, str):
        raise AggregateError(f"{name}: keys must be a list of column names, not a string")
    if not keys:
        raise AggregateError(
            f"{name}: keys must name at least one column (for a grand total group by a "
            "constant column, e.g. withColumn('all', lit(1)))"
        )
    if len(set(keys)) != len(keys):
        raise AggregateError(f"{name}: duplicate key columns in {list(keys)}")
    if not aggregates:
        raise AggregateError(f"{name}: at least one aggregate is needed")
    for agg in aggregates:
        if not _NAME.match(agg) or "__" in agg:
            raise AggregateError(
                f"{name}: aggregate name {agg!r} must be a plain identifier without '__'"
            )
    clashing = sorted(set(aggregates) & set(keys))
    if clashing:
        raise AggregateError(f"{name}: aggregate names {clashing} clash with key columns")
    internal = set(state_columns((), aggregates))
    reserved = sorted(internal & set(keys))
    if reserved:
        raise AggregateError(f"{name}: key columns {reserved} are reserved")


def missing_columns(
    available: Sequence[str], keys: Sequence[str], aggregates: Mapping[str, AggregateSpec]
) -> list[str]:
    """The columns the declaration reads that a batch lacks."""
    needed = [*keys, *(c for spec in aggregates.values() for c in spec.input_columns)]
    return sorted(set(needed) - set(available))
