"""The rules of incremental sources (``core.source_cursor``): a run's range, reruns and
concurrent runs, and how the cursor advances with a run's committed outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_finalckpt.core.arguments import check_splits
from airflow_finalckpt.core.errors import (
    InvalidStageArgumentError,
    SourceRangeBusyError,
    SourceRefusedError,
    is_permanent,
)
from airflow_finalckpt.core.source_cursor import (
    DELTA,
    ICEBERG,
    LANDING,
    Cursor,
    Listing,
    RangeState,
    RecordedRange,
    SourceFile,
    SourceRange,
    advance,
    choose_range,
    new_cursor,
    plan_range,
)
from airflow_finalckpt.sources import DeltaAppends, IcebergAppends, LandingDirectory


def f(name: str, identity: str | None = None) -> SourceFile:
    return SourceFile(split_id=f"file:///land/{name}", identity=identity or f"/land/{name}|1|0")


def recorded(key: str, state: RangeState, rng: SourceRange, **kw: object) -> RecordedRange:
    return RecordedRange(pipeline_key=key, stage_id="read", state=state, range=rng, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- ranges


def test_landing_range_is_every_file_not_consumed() -> None:
    cursor = Cursor("c", LANDING, consumed=frozenset({f("a").identity}))
    rng = plan_range(cursor, Listing(newest=None, files=(f("a"), f("b"), f("c"))))
    assert rng.splits == ["file:///land/b", "file:///land/c"]
    assert (rng.start, rng.end, rng.cursor_version) == (None, None, 0)


def test_a_file_rewritten_in_place_is_new_input() -> None:
    cursor = Cursor("c", LANDING, consumed=frozenset({"/land/a|1|0"}))
    rng = plan_range(cursor, Listing(newest=None, files=(f("a", "/land/a|2|5"),)))
    assert rng.splits == ["file:///land/a"]


def test_table_range_runs_from_the_cursor_to_the_newest_position() -> None:
    cursor = Cursor("c", ICEBERG, position=7, version=3)
    rng = plan_range(cursor, Listing(newest=9, files=(f("x"), f("y"))))
    assert (rng.start, rng.end, rng.cursor_version) == (7, 9, 3)
    assert len(rng.files) == 2


def test_a_split_listed_twice_is_refused() -> None:
    with pytest.raises(SourceRefusedError, match="listed twice"):
        plan_range(new_cursor("c", DELTA), Listing(newest=2, files=(f("a", "1"), f("a", "2"))))


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        new_cursor("c", "kafka")


def test_ranges_and_cursors_round_trip_through_json() -> None:
    rng = plan_range(Cursor("c", DELTA, position=1), Listing(newest=4, files=(f("a"), f("b"))))
    assert SourceRange.from_json("c", rng.to_json()) == rng
    cursor = Cursor("c", LANDING, consumed=frozenset({"x", "y"}), version=2)
    assert Cursor.from_json("c", cursor.to_json()) == cursor


# ---------------------------------------------------------------------------- choice


def _rng() -> SourceRange:
    return plan_range(new_cursor("c", LANDING), Listing(newest=None, files=(f("a"),)))


def test_a_pipeline_reads_its_recorded_range_again() -> None:
    own = recorded("p1", RangeState.COMMITTED, _rng())
    other = recorded("p2", RangeState.OPEN, _rng())
    assert choose_range("c", "p1", None, [other, own]).recorded == own


def test_another_open_range_refuses_the_run_naming_it() -> None:
    other = recorded("p2", RangeState.OPEN, _rng(), dag_id="d", run_id="scheduled__2")
    with pytest.raises(SourceRangeBusyError, match="scheduled__2") as caught:
        choose_range("c", "p1", None, [other])
    assert not is_permanent(caught.value)  # Airflow retries: the other run may commit


def test_a_rerun_of_a_logical_date_recomputes_its_committed_range() -> None:
    day = "2026-11-01T00:00:00+00:00"
    first = recorded("p1", RangeState.COMMITTED, _rng(), logical_date=day)
    later = recorded("p2", RangeState.COMMITTED, _rng(), logical_date="2026-11-02T00:00:00+00:00")
    choice = choose_range("c", "p3", day, [first, later])
    assert choice.recorded == first and choice.rerun_of == "p1"


def test_a_new_logical_date_plans_a_new_range() -> None:
    first = recorded("p1", RangeState.COMMITTED, _rng(), logical_date="2026-11-01")
    assert choose_range("c", "p2", "2026-11-02", [first]).recorded is None
    assert choose_range("c", "p2", None, [first]).recorded is None


def test_a_recompute_reads_only_what_the_cursor_advanced_over() -> None:
    rng = plan_range(new_cursor("c", LANDING), Listing(newest=None, files=(f("a"), f("b"))))
    drained = recorded("p1", RangeState.COMMITTED, rng, read=frozenset({"file:///land/a"}))
    assert drained.effective().splits == ["file:///land/a"]
    assert recorded("p1", RangeState.COMMITTED, rng).effective() == rng


# ---------------------------------------------------------------------------- advance


def test_a_table_cursor_moves_to_the_end_of_a_range_read_whole() -> None:
    cursor = Cursor("c", ICEBERG, position=1, consumed=frozenset({"old"}), version=4)
    rng = plan_range(cursor, Listing(newest=5, files=(f("a", "a"), f("b", "b"))))
    moved = advance(cursor, rng, rng.splits)
    assert (moved.position, moved.consumed, moved.version) == (5, frozenset(), 5)


def test_a_drained_run_keeps_the_position_and_remembers_what_it_read() -> None:
    cursor = Cursor("c", DELTA, position=1)
    rng = plan_range(cursor, Listing(newest=5, files=(f("a", "a"), f("b", "b"))))
    moved = advance(cursor, rng, ["file:///land/a"])
    assert (moved.position, moved.consumed) == (1, frozenset({"a"}))
    # the next run reads the rest, up to the then newest position
    nxt = plan_range(moved, Listing(newest=6, files=(f("a", "a"), f("b", "b"), f("c", "c"))))
    assert nxt.splits == ["file:///land/b", "file:///land/c"]
    assert advance(moved, nxt, nxt.splits).position == 6


def test_a_landing_cursor_remembers_every_file_read() -> None:
    cursor = Cursor("c", LANDING, consumed=frozenset({"z"}))
    rng = plan_range(cursor, Listing(newest=None, files=(f("a", "a"), f("b", "b"))))
    moved = advance(cursor, rng, rng.splits)
    assert moved.consumed == {"z", "a", "b"} and moved.position is None


def test_an_advance_planned_from_another_version_is_refused() -> None:
    cursor = Cursor("c", ICEBERG, position=1, version=2)
    rng = plan_range(cursor, Listing(newest=5, files=(f("a"),)))
    moved = advance(cursor, rng, rng.splits)
    with pytest.raises(SourceRefusedError, match="cursor moved"):
        advance(moved, rng, rng.splits)  # never twice
    assert is_permanent(SourceRefusedError("x"))


def test_an_empty_range_advances_to_the_newest_position() -> None:
    cursor = Cursor("c", ICEBERG, position=3)
    rng = plan_range(cursor, Listing(newest=4))
    assert rng.splits == [] and advance(cursor, rng, []).position == 4


# ---------------------------------------------------------------------------- arguments


def test_a_stage_takes_an_incremental_source_as_its_splits() -> None:
    for source in (
        LandingDirectory("/land", pattern="*.parquet"),
        IcebergAppends("ns.t", warehouse="/wh"),
        DeltaAppends("/lake/t"),
    ):
        assert check_splits("read", source) is source


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LandingDirectory(""), "url"),
        (lambda: LandingDirectory("/x", ""), "pattern"),
        (lambda: LandingDirectory("/x", cursor_id="../up"), "cursor_id"),
        (lambda: IcebergAppends("t"), "namespace"),
        (lambda: IcebergAppends("ns.t"), "warehouse"),
        (lambda: DeltaAppends(""), "table_uri"),
    ],
)
def test_bad_source_arguments_are_refused_in_one_line(
    build: Callable[[], object], message: str
) -> None:
    with pytest.raises(InvalidStageArgumentError, match=message):
        build()
