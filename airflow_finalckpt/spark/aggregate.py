"""Incremental aggregation: a ``groupBy(keys).agg(...)`` that stays right across split batches,
crashes, stops and restores.

A plain aggregate run per batch commits one partial row per key and batch. Here each batch's
rows are folded into partial aggregates kept in keyed state (``ctx.set_state``: Parquet, durable
with the batch's record), and the result is emitted once, when the input ends: at the stage's
last batch (``ctx.last_batch``) or in its finish hook (a drain, or a restored attempt that had
nothing left to process)::

    from airflow_finalckpt.spark.aggregate import IncrementalAggregate, count, mean, sum_

    totals = IncrementalAggregate(
        "totals", keys=["event_date", "key"], aggs={"n": count(), "amount": sum_("amount")}
    )

    @finalckpt_stage(commit_mode="final", sinks=[...])
    def aggregate(ctx):
        return totals.update(ctx, ctx.read_parts())   # None until the input ends

    aggregate.finish(totals.result)

The result equals ``frame.groupBy(keys).agg(...)`` over the whole input, with the same column
types (``totals.plain(frame)`` is that plain job). Floating-point sums and means are equal up to
rounding, as Spark's own are between two partitionings of the same rows. The merge rules are in
``core.aggregation``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DecimalType,
    LongType,
    StructType,
    _parse_datatype_json_string,
)

from airflow_finalckpt.core.aggregation import (
    ROWS_PARTIAL,
    AggregateError,
    AggregateKind,
    AggregateSpec,
    Merge,
    Part,
    check_declaration,
    distinct_column,
    missing_columns,
    partial_column,
    state_columns,
)
from airflow_finalckpt.spark.stage import BatchContext

__all__ = [
    "AggregateError",
    "AggregateSpec",
    "IncrementalAggregate",
    "count",
    "count_distinct",
    "first",
    "last",
    "max_",
    "mean",
    "min_",
    "sum_",
]

#: Field metadata of the row-count column: the result schema of the plain aggregation, so the
#: finish hook (which sees no input) emits the plain job's column types.
_RESULT_SCHEMA = "finalckpt.aggregate.result_schema"


def count(column: str | None = None) -> AggregateSpec:
    """Rows per key (``count(*)``), or non-null values of ``column``: a long."""
    return AggregateSpec(AggregateKind.COUNT, column)


def sum_(column: str) -> AggregateSpec:
    """Sum of ``column`` (Spark's ``sum`` type: long for integers, double, wider decimal)."""
    return AggregateSpec(AggregateKind.SUM, column)


def min_(column: str) -> AggregateSpec:
    """Smallest value of ``column``."""
    return AggregateSpec(AggregateKind.MIN, column)


def max_(column: str) -> AggregateSpec:
    """Largest value of ``column``."""
    return AggregateSpec(AggregateKind.MAX, column)


def mean(column: str) -> AggregateSpec:
    """Average of ``column`` (``avg``: a double, a decimal for decimals), kept as sum and count."""
    return AggregateSpec(AggregateKind.MEAN, column)


def count_distinct(column: str) -> AggregateSpec:
    """Exact number of distinct non-null values of ``column``; its state keeps every distinct
    (key, value) pair, so it grows with them.
    """
    return AggregateSpec(AggregateKind.COUNT_DISTINCT, column)


def first(column: str, by: str) -> AggregateSpec:
    """``column`` of the row with the smallest ``by`` (Spark's ``min_by``; ties: any of them)."""
    return AggregateSpec(AggregateKind.FIRST, column, by)


def last(column: str, by: str) -> AggregateSpec:
    """``column`` of the row with the largest ``by`` (Spark's ``max_by``; ties: any of them)."""
    return AggregateSpec(AggregateKind.LAST, column, by)


class IncrementalAggregate:
    """``groupBy(keys).agg(aggs)`` over a stage's whole input, kept in the stage's keyed state
    under ``name`` (one stage may hold several, under different names).

    The state is one frame: a partial row per key, and for exact distinct counts one row per
    distinct (key, value) pair (its partials null), so a batch costs one shuffle and one write.
    """

    def __init__(self, name: str, keys: Sequence[str], aggs: Mapping[str, AggregateSpec]) -> None:
        check_declaration(name, keys, aggs)
        self.name = name
        self.keys = tuple(keys)
        self.aggs = dict(aggs)
        self._distinct = [agg for agg, spec in self.aggs.items() if spec.keeps_distinct]

    def plain(self, frame: DataFrame) -> DataFrame:
        """The plain job: ``frame.groupBy(keys).agg(...)`` in one go (the reference result)."""
        self._check_input(frame)
        exprs = [_plain_expr(spec).alias(agg) for agg, spec in self.aggs.items()]
        return frame.groupBy(*self.keys).agg(*exprs)

    def update(self, ctx: BatchContext, frame: DataFrame) -> DataFrame | None:
        """Fold one batch into the state; at the stage's last batch return the result (and
        drop the state), else None: nothing is emitted before the input ends.
        """
        merged = self._merge(ctx.get_state(self.name), frame)
        if ctx.last_batch:
            ctx.drop_state(self.name)
            return self._finalize(merged)
        ctx.set_state(self.name, merged)
        return None

    def result(self, ctx: BatchContext) -> DataFrame | None:
        """The finish hook: the result of what the state holds (None when the stage's last
        batch already emitted it, or no batch ran). Leaves the state as it is: a finish redone
        after a crash emits the same rows into the same part.
        """
        state = ctx.get_state(self.name)
        return None if state is None else self._finalize(self._checked_state(state))

    # -- partials --------------------------------------------------------------------------

    def _check_input(self, frame: DataFrame) -> None:
        missing = missing_columns(frame.columns, self.keys, self.aggs)
        if missing:
            raise AggregateError(
                f"incremental aggregate {self.name!r}: the input lacks the columns {missing}"
            )

    def _partial_types(self, frame: DataFrame) -> dict[str, DataType]:
        """The type of every state column: partials as Spark aggregates a batch (analysis
        only, no Spark job), distinct values as the input holds them.
        """
        exprs = [
            _partial_expr(spec, part, frame.schema).alias(partial_column(agg, part.suffix))
            for agg, spec in self.aggs.items()
            for part in spec.parts
        ]
        types = {f.name: f.dataType for f in frame.groupBy().agg(F.count(F.lit(1)), *exprs).schema}
        types[ROWS_PARTIAL] = LongType()
        for agg in self._distinct:
            types[distinct_column(agg)] = frame.schema[str(self.aggs[agg].column)].dataType
        return types

    def _batch_rows(self, frame: DataFrame, types: Mapping[str, DataType]) -> DataFrame:
        """Each input row as a one-row partial, plus a row per distinct-count value."""
        partials = [
            (partial_column(agg, part.suffix), _row_expr(spec, part, frame.schema))
            for agg, spec in self.aggs.items()
            for part in spec.parts
        ]
        distinct = [(distinct_column(agg), str(self.aggs[agg].column)) for agg in self._distinct]

        def typed(name: str, value: Column | None) -> Column:
            return (F.lit(None) if value is None else value).cast(types[name]).alias(name)

        keys = [F.col(_quoted(k)) for k in self.keys]
        rows = frame.select(
            *keys,
            typed(ROWS_PARTIAL, F.lit(1)),
            *(typed(name, expr) for name, expr in partials),
            *(typed(name, None) for name, _ in distinct),
        )
        for name, source in distinct:
            value = F.col(_quoted(source))
            rows = rows.unionByName(
                frame.where(value.isNotNull()).select(
                    *keys,
                    typed(ROWS_PARTIAL, F.lit(0)),
                    *(typed(other, None) for other, _ in partials),
                    *(typed(other, value if other == name else None) for other, _ in distinct),
                )
            )
        return rows

    def _merge(self, state: DataFrame | None, frame: DataFrame) -> DataFrame:
        """The state with one more batch merged in: one row per key and distinct value."""
        result_schema = self.plain(frame).schema  # analysis only: no Spark job
        types = self._partial_types(frame)
        rows = self._batch_rows(frame, types)
        if state is not None:
            rows = self._checked_state(state).unionByName(rows)
        meta = {_RESULT_SCHEMA: result_schema.json()}
        distinct = [distinct_column(agg) for agg in self._distinct]
        return rows.groupBy(*self.keys, *distinct).agg(
            F.sum(ROWS_PARTIAL).cast("long").alias(ROWS_PARTIAL, metadata=meta),
            *self._merged_partials(types),
        )

    def _merged_partials(self, types: Mapping[str, DataType]) -> list[Column]:
        exprs = []
        for agg, spec in self.aggs.items():
            for part in spec.parts:
                column = partial_column(agg, part.suffix)
                by = None if part.by is None else partial_column(agg, part.by)
                exprs.append(_merge_expr(part.merge, column, by).cast(types[column]).alias(column))
        return exprs

    def _checked_state(self, state: DataFrame) -> DataFrame:
        expected = state_columns(self.keys, self.aggs)
        if sorted(state.columns) != sorted(expected) or _RESULT_SCHEMA not in (
            state.schema[ROWS_PARTIAL].metadata if ROWS_PARTIAL in state.columns else {}
        ):
            raise AggregateError(
                f"incremental aggregate {self.name!r}: its state has the columns "
                f"{sorted(state.columns)}, the declaration needs {sorted(expected)}; restore it "
                "with the keys and aggregates that wrote it"
            )
        return state.select(*expected)

    # -- result ----------------------------------------------------------------------------

    def _finalize(self, merged: DataFrame) -> DataFrame:
        """The plain aggregation's rows and column types from the merged state."""
        result_schema = _parse_schema(merged.schema[ROWS_PARTIAL].metadata[_RESULT_SCHEMA])
        types = {f.name: f.dataType for f in merged.schema.fields}
        counts = [F.count(distinct_column(agg)).alias(agg) for agg in self._distinct]
        per_key = merged.groupBy(*self.keys).agg(*self._merged_partials(types), *counts)
        finals = [
            _final_expr(agg, spec, types).cast(result_schema[agg].dataType).alias(agg)
            for agg, spec in self.aggs.items()
        ]
        return per_key.select(*(F.col(_quoted(k)) for k in self.keys), *finals)


def _quoted(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def _parse_schema(doc: str) -> StructType:
    parsed = _parse_datatype_json_string(doc)
    assert isinstance(parsed, StructType)
    return parsed


def _plain_expr(spec: AggregateSpec) -> Column:
    """The aggregate as plain Spark computes it over all rows at once."""
    column = F.col(_quoted(spec.column)) if spec.column is not None else None
    by = F.col(_quoted(spec.by)) if spec.by is not None else None
    kind = spec.kind
    if kind is AggregateKind.COUNT:
        return F.count(F.lit(1) if column is None else column)
    assert column is not None
    if kind in (AggregateKind.FIRST, AggregateKind.LAST):
        assert by is not None
        return (F.min_by if kind is AggregateKind.FIRST else F.max_by)(column, by)
    plain = {
        AggregateKind.SUM: F.sum,
        AggregateKind.MIN: F.min,
        AggregateKind.MAX: F.max,
        AggregateKind.MEAN: F.avg,
        AggregateKind.COUNT_DISTINCT: F.count_distinct,
    }
    return plain[kind](column)


def _partial_expr(spec: AggregateSpec, part: Part, schema: StructType) -> Column:
    """One batch's partial of one part."""
    if spec.kind is AggregateKind.COUNT or part.suffix == "count":
        return F.count(F.lit(1) if spec.column is None else F.col(_quoted(spec.column)))
    assert spec.column is not None
    column = F.col(_quoted(spec.column))
    if spec.kind is AggregateKind.MEAN:
        # Spark's avg sums decimals as decimals (10 digits wider) and everything else as doubles
        exact = isinstance(schema[spec.column].dataType, DecimalType)
        return F.sum(column if exact else column.cast("double"))
    if part.merge in (Merge.MIN_BY, Merge.MAX_BY):
        assert spec.by is not None
        return _merge_expr(part.merge, spec.column, spec.by)
    if part.suffix == "order":
        assert spec.by is not None
        return _merge_expr(part.merge, spec.by, None)
    return _merge_expr(part.merge, spec.column, None)


def _row_expr(spec: AggregateSpec, part: Part, schema: StructType) -> Column:
    """One input row as a partial of one part (merged by ``part.merge``)."""
    if spec.kind is AggregateKind.COUNT or part.suffix == "count":
        if spec.column is None:
            return F.lit(1)
        return F.when(F.col(_quoted(spec.column)).isNotNull(), F.lit(1)).otherwise(F.lit(0))
    assert spec.column is not None
    if part.suffix == "order":
        assert spec.by is not None
        return F.col(_quoted(spec.by))
    column = F.col(_quoted(spec.column))
    if spec.kind is AggregateKind.MEAN and not isinstance(
        schema[spec.column].dataType, DecimalType
    ):
        return column.cast("double")
    return column


def _merge_expr(merge: Merge, column: str, by: str | None) -> Column:
    """Combine values (or partials) of ``column``; ``*_BY``: the one at ``by``'s extreme."""
    value = F.col(_quoted(column))
    if merge is Merge.MIN_BY or merge is Merge.MAX_BY:
        assert by is not None
        return (F.min_by if merge is Merge.MIN_BY else F.max_by)(value, F.col(_quoted(by)))
    return {Merge.SUM: F.sum, Merge.MIN: F.min, Merge.MAX: F.max}[merge](value)


def _final_expr(agg: str, spec: AggregateSpec, types: Mapping[str, DataType]) -> Column:
    """The final value of one aggregate from its merged partials (before the result cast)."""
    if spec.keeps_distinct:
        return F.col(_quoted(agg))
    parts = {part.suffix: F.col(_quoted(partial_column(agg, part.suffix))) for part in spec.parts}
    if spec.kind is AggregateKind.MEAN:
        total, rows = parts["sum"], parts["count"]
        exact = isinstance(types[partial_column(agg, spec.parts[0].suffix)], DecimalType)
        divisor = rows.cast("decimal(20,0)") if exact else rows.cast("double")
        return F.when(rows > 0, total / divisor)
    return parts["value"] if "value" in parts else next(iter(parts.values()))
