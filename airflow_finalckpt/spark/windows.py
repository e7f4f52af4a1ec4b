"""Event-time tumbling windows over a stage's split batches, with explicit, mergeable state.

A stage feeds its batches one after the other through :func:`advance`. The state between two
batches is a plain DataFrame of partial aggregates, one row per key and open window, so the
runtime can write it as Parquet and a later batch, maybe in a new process after a crash, can
read it back. Nothing is kept in Python objects.

Semantics (Flink's bounded-out-of-orderness watermark, tumbling event-time windows):

* the watermark after a batch is ``max(previous, max event time in batch - out_of_orderness)``;
* the window ``[start, start + size)`` fires once, when ``watermark >= end + allowed_lateness``;
* a row whose window already fired is late: dropped and counted in ``late_rows``;
* :func:`flush` is the MAX_WATERMARK jump of a drain or the end of input: every open window fires.

Averages are kept as sum and count and divided only at emission, so partial states merge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType

from airflow_finalckpt.core.errors import FinalCheckpointError
from airflow_finalckpt.core.model import MIN_WATERMARK

WINDOW_START = "window_start_ms"
WINDOW_END = "window_end_ms"
# Bookkeeping columns of one advance step; never part of the state or the output.
_LATE = "__late"
_ROWS = "__rows"
_MAX_EVENT_TIME = "__max_event_time"
_RESERVED = frozenset({WINDOW_START, WINDOW_END, _LATE, _ROWS, _MAX_EVENT_TIME})


class WindowError(FinalCheckpointError):
    """Window input or state does not fit the window spec and aggregates."""


class AggregateKind(StrEnum):
    """How a window aggregates a column."""

    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    AVG = "avg"


@dataclass(frozen=True)
class WindowSpec:
    """Tumbling event-time windows of ``size_ms`` per ``key_columns`` over ``time_column``.

    ``time_column`` holds integer milliseconds since the epoch (the project's event time).
    """

    key_columns: tuple[str, ...]
    time_column: str
    size_ms: int
    out_of_orderness_ms: int = 0
    allowed_lateness_ms: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.key_columns, str):
            raise ValueError("key_columns must be a tuple of column names, not a string")
        object.__setattr__(self, "key_columns", tuple(self.key_columns))
        if self.size_ms <= 0:
            raise ValueError(f"size_ms must be positive, got {self.size_ms}")
        if self.out_of_orderness_ms < 0 or self.allowed_lateness_ms < 0:
            raise ValueError("out_of_orderness_ms and allowed_lateness_ms must be >= 0")
        if len(set(self.key_columns)) != len(self.key_columns):
            raise ValueError(f"duplicate key columns in {self.key_columns}")
        clashing = _RESERVED & {*self.key_columns, self.time_column}
        if clashing:
            raise ValueError(f"column names {sorted(clashing)} are reserved by the window operator")

    def last_fired_start(self, watermark: int) -> int | None:
        """The largest window start whose window has fired at ``watermark`` (None: none has)."""
        bound = watermark - self.allowed_lateness_ms - self.size_ms
        return bound if bound >= MIN_WATERMARK else None


@dataclass(frozen=True)
class Aggregate:
    """One output column: ``kind`` over ``column`` (``count`` without a column counts rows).

    Nulls are ignored like in SQL: ``count(column)`` counts non-null values, ``sum``/``avg``
    of only nulls is null.
    """

    name: str
    kind: AggregateKind
    column: str | None = None

    def __post_init__(self) -> None:
        if self.kind is not AggregateKind.COUNT and self.column is None:
            raise ValueError(f"aggregate {self.name!r}: {self.kind} needs a column")
        if self.name in _RESERVED or "__" in self.name:
            raise ValueError(f"aggregate name {self.name!r} is reserved or contains '__'")

    @classmethod
    def count(cls, name: str, column: str | None = None) -> Aggregate:
        """Count rows (or non-null values of ``column``) per window."""
        return cls(name, AggregateKind.COUNT, column)

    @classmethod
    def sum(cls, name: str, column: str) -> Aggregate:
        """Sum ``column`` per window."""
        return cls(name, AggregateKind.SUM, column)

    @classmethod
    def min(cls, name: str, column: str) -> Aggregate:
        """Minimum of ``column`` per window."""
        return cls(name, AggregateKind.MIN, column)

    @classmethod
    def max(cls, name: str, column: str) -> Aggregate:
        """Maximum of ``column`` per window."""
        return cls(name, AggregateKind.MAX, column)

    @classmethod
    def avg(cls, name: str, column: str) -> Aggregate:
        """Average of ``column`` per window (kept as a sum and a count)."""
        return cls(name, AggregateKind.AVG, column)

    @property
    def partial_parts(self) -> tuple[str, ...]:
        """The mergeable pieces kept in state: an average is a sum and a count."""
        if self.kind is AggregateKind.AVG:
            return ("sum", "count")
        return (str(self.kind),)

    def partial_column(self, part: str) -> str:
        """The state column holding one partial of this aggregate."""
        return f"{self.name}__{part}"

    @property
    def partial_columns(self) -> tuple[str, ...]:
        """Every state column of this aggregate."""
        return tuple(self.partial_column(part) for part in self.partial_parts)


@dataclass(frozen=True)
class WindowStep:
    """What one batch did: windows that fired, the state to keep, the new watermark."""

    fired: DataFrame
    state: DataFrame
    watermark: int
    late_rows: int


def state_columns(spec: WindowSpec, aggregates: Sequence[Aggregate]) -> list[str]:
    """The columns of a state frame, in order: keys, window start, partial aggregates."""
    _check_aggregates(spec, aggregates)
    partials = [name for aggregate in aggregates for name in aggregate.partial_columns]
    return [*spec.key_columns, WINDOW_START, *partials]


def output_columns(spec: WindowSpec, aggregates: Sequence[Aggregate]) -> list[str]:
    """The columns of fired windows, in order: keys, window bounds, aggregates."""
    _check_aggregates(spec, aggregates)
    return [*spec.key_columns, WINDOW_START, WINDOW_END, *(agg.name for agg in aggregates)]


def advance(
    batch: DataFrame,
    state: DataFrame | None,
    watermark: int | None,
    spec: WindowSpec,
    aggregates: Sequence[Aggregate],
    *,
    final: bool = False,
) -> WindowStep:
    """Add one batch of rows: fire the windows the new watermark closes, keep the others.

    ``state`` and ``watermark`` are the previous step's (the state possibly read back from
    Parquet in another process); both None before the first batch. The batch is read once: its
    rows are merged with the state and the (small) result is checkpointed locally, which also
    cuts the lineage between batches, so writing ``fired`` and ``state`` is cheap.

    ``final``: the input ends with this batch, so every open window fires in it (as
    :func:`flush` would right after) and the returned state is empty: the stage's last batch
    writes one output and no state. Rows late for the previous watermark are still dropped.
    """
    state_cols = state_columns(spec, aggregates)
    _check_batch(batch, spec, aggregates)
    previous = MIN_WATERMARK if watermark is None else watermark
    rows = _rows_as_partials(batch, spec, aggregates, spec.last_fired_start(previous))
    if state is not None:
        rows = rows.unionByName(_state_as_partials(state, state_cols))
    merged = _merge_partials(rows, spec, aggregates).localCheckpoint(eager=True)

    max_event_time, late_rows, rows_without_time = _batch_statistics(merged)
    if rows_without_time:
        raise WindowError(
            f"{rows_without_time} rows have a null {spec.time_column!r}: "
            "every row needs an event time"
        )
    new_watermark = previous
    if max_event_time is not None:
        new_watermark = max(previous, max_event_time - spec.out_of_orderness_ms)

    on_time = merged.where(~F.col(_LATE))
    fired_start = spec.last_fired_start(new_watermark)
    if final:
        fires = F.lit(True)
    elif fired_start is None:
        fires = F.lit(False)
    else:
        fires = F.col(WINDOW_START) <= F.lit(fired_start)
    fired = _finalize(on_time.where(fires), spec, aggregates)
    kept = on_time.where(~fires).select(*state_cols)
    return WindowStep(fired=fired, state=kept, watermark=new_watermark, late_rows=late_rows)


def flush(state: DataFrame, spec: WindowSpec, aggregates: Sequence[Aggregate]) -> DataFrame:
    """Fire every open window of ``state``: the watermark jumps to MAX_WATERMARK (drain)."""
    state_cols = state_columns(spec, aggregates)
    return _finalize(_state_as_partials(state, state_cols), spec, aggregates)


def _check_aggregates(spec: WindowSpec, aggregates: Sequence[Aggregate]) -> None:
    if not aggregates:
        raise ValueError("at least one aggregate is needed")
    names = [aggregate.name for aggregate in aggregates]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"duplicate aggregate names {duplicates}")
    clashing = sorted(set(names) & set(spec.key_columns))
    if clashing:
        raise ValueError(f"aggregate names {clashing} clash with key columns")


def _check_batch(batch: DataFrame, spec: WindowSpec, aggregates: Sequence[Aggregate]) -> None:
    needed = [*spec.key_columns, spec.time_column]
    needed += [agg.column for agg in aggregates if agg.column is not None]
    missing = sorted(set(needed) - set(batch.columns))
    if missing:
        raise WindowError(f"batch lacks the columns {missing} the window spec needs")
    time_type = batch.schema[spec.time_column].dataType
    if not isinstance(time_type, LongType | IntegerType):
        raise WindowError(
            f"event time column {spec.time_column!r} must hold integer milliseconds, "
            f"found {time_type.simpleString()}"
        )


def _window_start(event_time: Column, size_ms: int) -> Column:
    """Floor to the window size; ``pmod`` keeps the floor right for negative times too."""
    return event_time - F.pmod(event_time, F.lit(size_ms).cast("long"))


def _rows_as_partials(
    batch: DataFrame,
    spec: WindowSpec,
    aggregates: Sequence[Aggregate],
    late_start: int | None,
) -> DataFrame:
    """Each batch row as a one-row partial aggregate, flagged late if its window fired."""
    event_time = F.col(spec.time_column).cast("long")
    start = _window_start(event_time, spec.size_ms)
    late = F.lit(False) if late_start is None else start <= F.lit(late_start)
    partials = [
        expr.alias(agg.partial_column(part))
        for agg in aggregates
        for part, expr in _row_partial(agg).items()
    ]
    return batch.select(
        *(F.col(key) for key in spec.key_columns),
        start.alias(WINDOW_START),
        late.alias(_LATE),
        F.lit(1).cast("long").alias(_ROWS),
        event_time.alias(_MAX_EVENT_TIME),
        *partials,
    )


def _row_partial(aggregate: Aggregate) -> dict[str, Column]:
    if aggregate.column is None:
        return {"count": F.lit(1).cast("long")}
    value = F.col(aggregate.column)
    present = F.when(value.isNotNull(), F.lit(1)).otherwise(F.lit(0)).cast("long")
    if aggregate.kind is AggregateKind.COUNT:
        return {"count": present}
    if aggregate.kind is AggregateKind.AVG:
        return {"sum": value.cast("double"), "count": present}
    return {str(aggregate.kind): value}


def _state_as_partials(state: DataFrame, state_cols: list[str]) -> DataFrame:
    """A state frame in the row-partial shape; a state of other aggregates is refused."""
    found = set(state.columns) - {WINDOW_END}
    if found != set(state_cols):
        missing = sorted(set(state_cols) - found)
        unexpected = sorted(found - set(state_cols))
        raise WindowError(
            "window state does not match the window spec and aggregates "
            f"(missing columns {missing}, unexpected columns {unexpected}); "
            "restore it with the spec that wrote it"
        )
    return state.select(
        *state_cols,
        F.lit(False).alias(_LATE),
        F.lit(0).cast("long").alias(_ROWS),
        F.lit(None).cast("long").alias(_MAX_EVENT_TIME),
    )


def _merge_partials(
    rows: DataFrame, spec: WindowSpec, aggregates: Sequence[Aggregate]
) -> DataFrame:
    """One row per key, window and lateness: partials merged, batch row count and max time."""
    merges = []
    for agg in aggregates:
        for part in agg.partial_parts:
            column = agg.partial_column(part)
            merge = {"min": F.min, "max": F.max}.get(part, F.sum)
            merges.append(merge(F.col(column)).alias(column))
    return rows.groupBy(*spec.key_columns, WINDOW_START, _LATE).agg(
        F.sum(_ROWS).alias(_ROWS), F.max(_MAX_EVENT_TIME).alias(_MAX_EVENT_TIME), *merges
    )


def _batch_statistics(merged: DataFrame) -> tuple[int | None, int, int]:
    """Max event time of the batch, its late rows, its rows without event time: one job."""
    row = merged.agg(
        F.max(_MAX_EVENT_TIME),
        F.sum(F.when(F.col(_LATE), F.col(_ROWS))),
        F.sum(F.when(F.col(WINDOW_START).isNull(), F.col(_ROWS))),
    ).first()
    assert row is not None  # a global aggregate always returns one row
    return row[0], int(row[1] or 0), int(row[2] or 0)


def _finalize(partials: DataFrame, spec: WindowSpec, aggregates: Sequence[Aggregate]) -> DataFrame:
    """Fired windows in the output shape, ordered by window start then keys."""
    finals = []
    for agg in aggregates:
        if agg.kind is AggregateKind.AVG:
            total = F.col(agg.partial_column("sum"))
            count = F.col(agg.partial_column("count"))
            final = F.when(count > 0, total / count.cast("double"))
        else:
            final = F.col(agg.partial_column(str(agg.kind)))
        finals.append(final.alias(agg.name))
    return partials.select(
        *spec.key_columns,
        F.col(WINDOW_START),
        (F.col(WINDOW_START) + F.lit(spec.size_ms)).alias(WINDOW_END),
        *finals,
    ).orderBy(WINDOW_START, *spec.key_columns)
