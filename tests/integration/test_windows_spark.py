"""The event-time window operator on Spark, checked against plain pandas group-bys."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from airflow_finalckpt.core.model import MIN_WATERMARK
from airflow_finalckpt.examples.nycflights13.reference import assert_windows_match
from airflow_finalckpt.spark.windows import (
    Aggregate,
    WindowError,
    WindowSpec,
    WindowStep,
    advance,
    flush,
    output_columns,
    state_columns,
)

SIZE = 1_000
SCHEMA = "k string, t long, v double, n long"
AGGREGATES = (
    Aggregate.count("rows"),
    Aggregate.count("v_count", "v"),
    Aggregate.sum("v_sum", "v"),
    Aggregate.min("v_min", "v"),
    Aggregate.max("n_max", "n"),
    Aggregate.avg("v_avg", "v"),
    Aggregate.sum("n_sum", "n"),
)
KEY = ("k", "window_start_ms")
APPROXIMATE = ("v_sum", "v_avg")

Row = tuple[str, int, float | None, int | None]


def spec(out_of_orderness_ms: int = 0, allowed_lateness_ms: int = 0) -> WindowSpec:
    return WindowSpec(("k",), "t", SIZE, out_of_orderness_ms, allowed_lateness_ms)


def random_rows(seed: int, count: int, t_start: int, t_end: int) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        value = None if rng.random() < 0.15 else round(rng.uniform(-50, 50), 3)
        number = None if rng.random() < 0.15 else rng.randint(-5, 100)
        rows.append((rng.choice("abc"), rng.randrange(t_start, t_end), value, number))
    return rows


def frame(spark: SparkSession, rows: Sequence[Row]) -> DataFrame:
    return spark.createDataFrame(list(rows), SCHEMA)


def pandas_windows(rows: Sequence[Row]) -> pd.DataFrame:
    """The expected windows, computed with pandas alone."""
    table = pd.DataFrame(rows, columns=["k", "t", "v", "n"]).astype(
        {"t": "int64", "v": "float64", "n": "float64"}
    )
    table["window_start_ms"] = table["t"] // SIZE * SIZE
    grouped = table.groupby(list(KEY))
    result = pd.DataFrame(
        {
            "rows": grouped.size(),
            "v_count": grouped["v"].count(),
            "v_sum": grouped["v"].sum(min_count=1),
            "v_min": grouped["v"].min(),
            "n_max": grouped["n"].max(),
            "v_avg": grouped["v"].mean(),
            "n_sum": grouped["n"].sum(min_count=1),
        }
    ).reset_index()
    result["window_end_ms"] = result["window_start_ms"] + SIZE
    return result


def pandas_of(collectable: DataFrame) -> pd.DataFrame:
    """Collect a small Spark frame as pandas."""
    collected = collectable.toPandas()
    assert isinstance(collected, pd.DataFrame)
    return collected


def assert_same_windows(actual: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert_windows_match(actual, expected, key=KEY, approximate=APPROXIMATE)


def run_batches(
    spark: SparkSession,
    batches: Sequence[Sequence[Row]],
    window_spec: WindowSpec,
    state_dir: Path | None = None,
) -> tuple[list[WindowStep], list[pd.DataFrame], DataFrame | None]:
    """Advance batch after batch; with ``state_dir`` the state goes through Parquet each time."""
    steps, fired = [], []
    state: DataFrame | None = None
    watermark: int | None = None
    for number, rows in enumerate(batches):
        step = advance(frame(spark, rows), state, watermark, window_spec, AGGREGATES)
        steps.append(step)
        fired.append(pandas_of(step.fired))
        state, watermark = step.state, step.watermark
        if state_dir is not None:
            path = str(state_dir / f"state-{number}")
            state.write.mode("overwrite").parquet(path)
            state = spark.read.parquet(path)
    return steps, fired, state


def test_batches_with_state_through_parquet_equal_one_pandas_pass(
    spark: SparkSession, tmp_path: Path
) -> None:
    window_spec = spec(out_of_orderness_ms=700, allowed_lateness_ms=300)
    rows = sorted(random_rows(seed=1, count=400, t_start=0, t_end=12 * SIZE), key=lambda r: r[1])
    # Four batches in event-time order, each shuffled inside (only bounded disorder).
    batches = [rows[i : i + 100] for i in range(0, 400, 100)]
    for number, batch in enumerate(batches):
        random.Random(number).shuffle(batch)
    steps, fired, state = run_batches(spark, batches, window_spec, state_dir=tmp_path)
    assert state is not None
    drained = pandas_of(flush(state, window_spec, AGGREGATES))

    assert all(step.late_rows == 0 for step in steps)
    assert all(len(part) > 0 for part in fired[1:]), "windows must fire along the way"
    assert len(drained) > 0, "windows near the end must still be open before the drain"
    assert_same_windows(pd.concat([*fired, drained], ignore_index=True), pandas_windows(rows))

    max_time_so_far = [max(row[1] for row in rows[: end + 100]) for end in range(0, 400, 100)]
    assert [step.watermark for step in steps] == [t - 700 for t in max_time_so_far]
    previous = MIN_WATERMARK
    for step, part in zip(steps, fired, strict=True):
        fires_at = part["window_end_ms"] + window_spec.allowed_lateness_ms
        assert (fires_at <= step.watermark).all(), "a window fired before its time"
        assert (fires_at > previous).all(), "a window fired later than it should have"
        previous = step.watermark


def test_a_window_fires_when_the_watermark_reaches_end_plus_lateness(
    spark: SparkSession,
) -> None:
    window_spec = spec(out_of_orderness_ms=100, allowed_lateness_ms=200)
    one_short = [("a", 500, 1.0, 1), ("a", 1_299, 2.0, 2)]  # watermark 1199 < 1000 + 200
    exactly = [("a", 1_300, 3.0, 3)]  # watermark 1200 == end 1000 + lateness 200
    steps, fired, _ = run_batches(spark, [one_short, exactly], window_spec)
    assert [step.watermark for step in steps] == [1_199, 1_200]
    assert fired[0].empty
    assert_same_windows(fired[1], pandas_windows(one_short[:1]))


def test_rows_of_fired_windows_are_late_counted_and_dropped(spark: SparkSession) -> None:
    window_spec = spec()
    early = [("a", 100, 1.0, 1), ("a", 900, 2.0, 2), ("b", 1_500, 3.0, 3)]
    ahead = [("a", 3_200, 4.0, 4)]
    # Watermark 3200 after ``ahead``: windows ending at or before 3200 have fired, even the
    # empty [2000, 3000); only [3000, 4000) still takes rows.
    late = [("a", 10, 100.0, 100), ("b", 1_999, 200.0, 200), ("b", 2_100, 300.0, 300)]
    on_time = [("b", 3_100, 5.0, 5)]
    steps, fired, state = run_batches(spark, [early, ahead, late + on_time], window_spec)
    assert state is not None
    drained = pandas_of(flush(state, window_spec, AGGREGATES))

    assert [step.late_rows for step in steps] == [0, 0, len(late)]
    all_fired = pd.concat([*fired, drained], ignore_index=True)
    assert_same_windows(all_fired, pandas_windows(early + ahead + on_time))


def test_allowed_lateness_keeps_a_window_open_for_late_rows(spark: SparkSession) -> None:
    window_spec = spec(allowed_lateness_ms=1_500)
    first = [("a", 100, 1.0, 1), ("a", 2_200, 2.0, 2)]
    late_but_allowed = [("a", 300, 10.0, 10)]
    beyond = [("a", 2_600, 1.0, 1)]  # watermark 2600 >= end 1000 + lateness 1500
    too_late = [("a", 400, 100.0, 100)]
    batches = [first, late_but_allowed, beyond, too_late]
    steps, fired, state = run_batches(spark, batches, window_spec)
    assert state is not None

    assert steps[0].watermark == 2_200
    assert fired[0].empty, "end 1000 + lateness 1500 > watermark 2200: the window stays open"
    assert [step.late_rows for step in steps] == [0, 0, 0, 1]
    assert fired[2]["window_start_ms"].tolist() == [0]
    drained = pandas_of(flush(state, window_spec, AGGREGATES))
    assert_same_windows(
        pd.concat([*fired, drained], ignore_index=True),
        pandas_windows(first + late_but_allowed + beyond),
    )


def test_watermark_never_decreases(spark: SparkSession) -> None:
    window_spec = spec(out_of_orderness_ms=100)
    batches: list[list[Row]] = [
        [("a", 5_000, 1.0, 1)],
        [("a", 4_950, 1.0, 1)],
        [("b", 7_000, None, None)],
    ]
    steps, _, _ = run_batches(spark, batches, window_spec)
    assert [step.watermark for step in steps] == [4_900, 4_900, 6_900]


def test_empty_batch_keeps_watermark_and_state(spark: SparkSession) -> None:
    window_spec = spec()
    steps, _, state = run_batches(spark, [[("a", 1_500, 1.0, 1)], []], window_spec)
    assert state is not None
    assert steps[1].watermark == steps[0].watermark == 1_500
    assert state.count() == 1
    first_empty = advance(frame(spark, []), None, None, window_spec, AGGREGATES)
    assert first_empty.watermark == MIN_WATERMARK
    assert first_empty.fired.count() == 0


def test_flush_fires_every_open_window_once(spark: SparkSession) -> None:
    window_spec = spec(out_of_orderness_ms=8 * SIZE)
    rows = random_rows(seed=3, count=120, t_start=-3 * SIZE, t_end=4 * SIZE)
    _, fired, state = run_batches(spark, [rows[:60], rows[60:]], window_spec)
    assert state is not None
    assert all(part.empty for part in fired), "the out-of-orderness bound holds every window"
    drained = pandas_of(flush(state, window_spec, AGGREGATES))
    assert list(drained.columns) == output_columns(window_spec, AGGREGATES)
    assert_same_windows(drained, pandas_windows(rows))
    assert (drained["window_start_ms"] < 0).any(), "negative event times floor correctly"
    assert state.count() == len(drained)


def test_a_final_batch_fires_every_window_and_keeps_no_state(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The last batch of a stage fires what the batch + flush would, in one output: windows the
    watermark closes, the open ones, and late rows still dropped."""
    window_spec = spec(out_of_orderness_ms=700, allowed_lateness_ms=300)
    rows = sorted(random_rows(seed=5, count=300, t_start=0, t_end=9 * SIZE), key=lambda r: r[1])
    late = ("a", 10, 9.0, 9)  # its window [0, 1000) fired after the first batch
    _, fired, state = run_batches(spark, [rows[:200]], window_spec, state_dir=tmp_path)
    assert state is not None and state.count() > 0
    previous = advance(frame(spark, rows[:200]), None, None, window_spec, AGGREGATES)
    last_rows = [*rows[200:], late]
    final = advance(
        frame(spark, last_rows), state, previous.watermark, window_spec, AGGREGATES, final=True
    )
    assert final.state.count() == 0
    assert final.late_rows == 1
    assert final.watermark == max(r[1] for r in rows) - 700
    both = pd.concat([fired[0], pandas_of(final.fired)], ignore_index=True)
    assert_same_windows(both, pandas_windows(rows))
    # the same as a non-final step followed by a flush of its state
    step = advance(frame(spark, last_rows), state, previous.watermark, window_spec, AGGREGATES)
    flushed = pd.concat(
        [pandas_of(step.fired), pandas_of(flush(step.state, window_spec, AGGREGATES))],
        ignore_index=True,
    )
    assert_same_windows(pandas_of(final.fired), flushed)


def test_state_is_one_row_per_open_window_with_partials_only(spark: SparkSession) -> None:
    window_spec = spec()
    rows = [("a", 100, 1.0, 1), ("a", 200, 3.0, None), ("b", 150, None, 2), ("a", 1_200, 1.0, 1)]
    step = advance(frame(spark, rows), None, None, window_spec, AGGREGATES)
    state = pandas_of(step.state).sort_values(list(KEY)).reset_index(drop=True)
    assert list(step.state.columns) == state_columns(window_spec, AGGREGATES)
    assert state[["k", "window_start_ms"]].values.tolist() == [["a", 1_000]]
    fired = pandas_of(step.fired)
    assert_same_windows(fired, pandas_windows(rows[:3]))


def test_state_written_with_other_aggregates_is_refused(spark: SparkSession) -> None:
    window_spec = spec()
    step = advance(frame(spark, [("a", 100, 1.0, 1)]), None, None, window_spec, AGGREGATES)
    with pytest.raises(WindowError, match="v_avg__sum"):
        advance(frame(spark, []), step.state, step.watermark, window_spec, AGGREGATES[:2])
    with pytest.raises(WindowError, match="missing columns"):
        flush(step.state.drop("n_sum__sum"), window_spec, AGGREGATES)


def test_rows_without_event_time_or_with_non_integer_time_are_refused(
    spark: SparkSession,
) -> None:
    with pytest.raises(WindowError, match="null 't'"):
        advance(frame(spark, [("a", None, 1.0, 1)]), None, None, spec(), AGGREGATES)  # type: ignore[list-item]
    as_double = frame(spark, [("a", 1, 1.0, 1)]).selectExpr("k", "cast(t as double) t", "v", "n")
    with pytest.raises(WindowError, match="integer milliseconds"):
        advance(as_double, None, None, spec(), AGGREGATES)
    with pytest.raises(WindowError, match="lacks the columns"):
        advance(as_double.drop("v"), None, None, spec(), AGGREGATES)


def test_invalid_specs_and_aggregates_are_refused() -> None:
    with pytest.raises(ValueError, match="size_ms"):
        WindowSpec(("k",), "t", 0)
    with pytest.raises(ValueError, match=">= 0"):
        WindowSpec(("k",), "t", SIZE, out_of_orderness_ms=-1)
    with pytest.raises(ValueError, match="reserved"):
        WindowSpec(("window_start_ms",), "t", SIZE)
    with pytest.raises(ValueError, match="tuple"):
        WindowSpec("k", "t", SIZE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a column"):
        Aggregate("total", Aggregate.sum("x", "v").kind)
    with pytest.raises(ValueError, match="duplicate"):
        state_columns(spec(), (Aggregate.count("x"), Aggregate.sum("x", "v")))
    with pytest.raises(ValueError, match="clash"):
        output_columns(spec(), (Aggregate.count("k"),))


@st.composite
def ordered_batches(draw: st.DrawFn) -> tuple[list[Row], list[list[Row]], int]:
    times = draw(st.lists(st.integers(0, 6 * SIZE), min_size=1, max_size=30))
    keys = draw(st.lists(st.sampled_from("ab"), min_size=len(times), max_size=len(times)))
    values = draw(
        st.lists(
            st.one_of(st.none(), st.integers(-20, 20).map(float)),
            min_size=len(times),
            max_size=len(times),
        )
    )
    rows: list[Row] = sorted(
        (
            (k, t, v, None if v is None else int(v))
            for k, t, v in zip(keys, times, values, strict=True)
        ),
        key=lambda row: row[1],
    )
    cuts = sorted(set(draw(st.lists(st.integers(1, len(rows)), max_size=2))) | {len(rows)})
    batches = [rows[start:end] for start, end in zip([0, *cuts[:-1]], cuts, strict=True)]
    out_of_orderness = draw(st.sampled_from([0, 300, SIZE]))
    return rows, batches, out_of_orderness


@settings(max_examples=4, deadline=None, derandomize=True)
@given(case=ordered_batches())
def test_any_batching_in_event_time_order_fires_the_same_windows(
    spark: SparkSession, case: tuple[list[Row], list[list[Row]], int]
) -> None:
    rows, batches, out_of_orderness = case
    window_spec = spec(out_of_orderness_ms=out_of_orderness)
    steps, fired, state = run_batches(spark, batches, window_spec)
    assert state is not None
    batched = pd.concat([*fired, pandas_of(flush(state, window_spec, AGGREGATES))])
    _, one_fired, one_state = run_batches(spark, [rows], window_spec)
    assert one_state is not None
    at_once = pd.concat([*one_fired, pandas_of(flush(one_state, window_spec, AGGREGATES))])

    assert all(step.late_rows == 0 for step in steps)
    watermarks = [step.watermark for step in steps]
    assert watermarks == sorted(watermarks)
    assert_same_windows(batched.reset_index(drop=True), at_once.reset_index(drop=True))
    assert_same_windows(batched.reset_index(drop=True), pandas_windows(rows))
