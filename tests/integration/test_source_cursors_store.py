"""The cursor table and the recorded ranges in the coordination store (SQLite and
PostgreSQL): a run's range is recorded once, another run is refused while it is open, the
cursor advances once with the pipeline's last close, a rerun recomputes its recorded range.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from airflow_finalckpt.core.errors import SourceRangeBusyError, SourceRefusedError
from airflow_finalckpt.core.model import StageLifecycle, StageSnapshot
from airflow_finalckpt.core.run_context import RunContext
from airflow_finalckpt.core.source_cursor import Cursor, Listing, RangeState, SourceFile
from airflow_finalckpt.core.views import StageRow
from airflow_finalckpt.sources import LandingDirectory
from airflow_finalckpt.sources.claims import claim_splits
from airflow_finalckpt.store import rows as r
from airflow_finalckpt.store.cursors import (
    claim_range,
    ranges_of_pipeline,
    read_cursor,
    settle_ranges,
)
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from airflow_finalckpt.store.pipelines import delete_pipeline_rows


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    engine = make_engine(store_url)
    ensure_schema(engine)
    yield engine
    engine.dispose()


class Table:
    """A fake table source: files added per version."""

    def __init__(self) -> None:
        self.versions: list[list[str]] = []

    def append(self, *names: str) -> None:
        self.versions.append(list(names))

    def list_new(self, cursor: Cursor) -> Listing:
        first = 0 if cursor.position is None else cursor.position + 1
        files = [
            SourceFile(split_id=n, identity=n)
            for v in range(first, len(self.versions))
            for n in self.versions[v]
        ]
        return Listing(newest=len(self.versions) - 1, files=tuple(files))


def _claim(engine: Engine, table: Table, key: str, logical_date: str | None = None) -> list[str]:
    record = claim_range(
        engine,
        cursor_id="c",
        kind="delta",
        pipeline_key=key,
        stage_id="read",
        lister=table.list_new,
        now=lambda: 1.0,
        logical_date=logical_date,
    )
    return record.effective().splits


def _closed(finished: list[str]) -> StageRow:
    final = r.dump(StageSnapshot(finished_splits=frozenset(finished)))
    return StageRow(
        stage_id="read",
        lifecycle=StageLifecycle.CLOSED,
        epoch=1,
        total_splits=len(finished),
        finish_threshold=1,
        closed_checkpoint_id=1,
        updated_at=1.0,
        progress_data=final,
        final_data=final,
    )


def _settle(
    engine: Engine, key: str, finished: list[str], *, all_closed: bool = True
) -> list[Cursor]:
    lifecycles = {
        "read": StageLifecycle.CLOSED,
        "publish": StageLifecycle.CLOSED if all_closed else StageLifecycle.RUNNING,
    }
    with engine.begin() as conn:
        return settle_ranges(conn, key, lifecycles, lambda _s: _closed(finished), 2.0)


def test_a_run_reads_its_recorded_range_and_the_next_run_the_rest(engine: Engine) -> None:
    table = Table()
    table.append("a", "b")
    assert _claim(engine, table, "p1") == ["a", "b"]
    table.append("c")  # appended while p1 runs
    assert _claim(engine, table, "p1") == ["a", "b"]  # a retry: the same range
    with pytest.raises(SourceRangeBusyError, match="p1"):
        _claim(engine, table, "p2")  # p1's outputs are not committed yet
    assert _settle(engine, "p1", ["a", "b"], all_closed=False) == []  # publish still runs
    assert read_cursor(engine, "c").version == 0  # type: ignore[union-attr]
    (moved,) = _settle(engine, "p1", ["a", "b"])
    assert (moved.position, moved.version) == (0, 1)
    assert _settle(engine, "p1", ["a", "b"]) == []  # never twice
    assert _claim(engine, table, "p2") == ["c"]
    assert _claim(engine, table, "p1") == ["a", "b"]  # a clear of p1 recomputes its range
    (recorded,) = ranges_of_pipeline(engine, "p1")
    assert recorded.state is RangeState.COMMITTED


def test_a_rerun_of_a_logical_date_recomputes_its_range(engine: Engine) -> None:
    table = Table()
    table.append("a")
    assert _claim(engine, table, "p1", "2026-11-01") == ["a"]
    _settle(engine, "p1", ["a"])
    table.append("b")
    assert _claim(engine, table, "p2", "2026-11-01") == ["a"]  # the rerun of that day
    assert ranges_of_pipeline(engine, "p2")[0].state is RangeState.RECOMPUTE
    assert _settle(engine, "p2", ["a"]) == []  # a recompute never advances the cursor
    assert _claim(engine, table, "p3", "2026-11-02") == ["b"]


def test_deleting_a_pipeline_gives_its_open_range_back(engine: Engine) -> None:
    table = Table()
    table.append("a")
    _claim(engine, table, "abandoned")
    with pytest.raises(SourceRangeBusyError):
        _claim(engine, table, "p2")
    delete_pipeline_rows(engine, "abandoned")
    assert _claim(engine, table, "p2") == ["a"]


def test_a_cursor_of_another_kind_is_refused(engine: Engine) -> None:
    table = Table()
    table.append("a")
    _claim(engine, table, "p1")
    with pytest.raises(SourceRefusedError, match="belongs to a delta source"):
        claim_range(
            engine,
            cursor_id="c",
            kind="iceberg",
            pipeline_key="p9",
            stage_id="read",
            lister=table.list_new,
            now=lambda: 1.0,
        )


def test_landing_directory_claims_files_not_consumed(engine: Engine, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    (landing / "sub").mkdir(parents=True)
    for name in ("a.parquet", "sub/b.parquet", "_staging.parquet", "notes.txt"):
        (landing / name).write_bytes(b"x")
    (landing / ".c.parquet.tmp").write_bytes(b"x")
    source = LandingDirectory(str(landing), pattern="*.parquet")
    run = RunContext.of(dag_id="d", run_id="r1")
    splits = claim_splits(engine, source, pipeline_key="p1", stage_id="read", run=run)
    assert splits == [f"file://{landing}/a.parquet", f"file://{landing}/sub/b.parquet"]
    rng = ranges_of_pipeline(engine, "p1")[0].range
    with engine.begin() as conn:
        settle_ranges(
            conn,
            "p1",
            {"read": StageLifecycle.CLOSED},
            lambda _s: _closed(splits),
            2.0,
        )
    (landing / "c.parquet").write_bytes(b"y")
    (landing / "a.parquet").write_bytes(b"xx")  # rewritten in place: new input
    again = claim_splits(engine, source, pipeline_key="p2", stage_id="read", run=run)
    assert again == [f"file://{landing}/a.parquet", f"file://{landing}/c.parquet"]
    assert read_cursor(engine, "d.read").consumed == {f.identity for f in rng.files}  # type: ignore[union-attr]


def test_a_missing_landing_directory_is_refused(engine: Engine, tmp_path: Path) -> None:
    source = LandingDirectory(str(tmp_path / "nope"))
    with pytest.raises(SourceRefusedError, match="does not exist"):
        claim_splits(engine, source, pipeline_key="p1", stage_id="read")
    assert ranges_of_pipeline(engine, "p1") == []


def test_concurrent_runs_never_read_one_range_twice(engine: Engine) -> None:
    """Eight runs claim at once, each having listed before any of them wrote: one range is
    recorded, the seven others are refused (each re-decides under the cursor lock).
    """
    import contextlib
    import threading

    table = Table()
    table.append("a", "b")
    barrier = threading.Barrier(8)

    def listed_together(cursor: Cursor) -> Listing:
        # runs that listed wait for each other, so their writes race (a broken barrier: a run
        # saw a recorded range first and did not list)
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=10)
        return table.list_new(cursor)

    outcomes: dict[str, object] = {}

    def run(key: str) -> None:
        try:
            outcomes[key] = claim_range(
                engine,
                cursor_id="c",
                kind="delta",
                pipeline_key=key,
                stage_id="read",
                lister=listed_together,
                now=lambda: 1.0,
            ).range.splits
        except SourceRangeBusyError as exc:
            outcomes[key] = exc

    threads = [threading.Thread(target=run, args=(f"p{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [k for k, v in outcomes.items() if v == ["a", "b"]]
    assert len(won) == 1 and len(outcomes) == 8
    assert all(isinstance(v, SourceRangeBusyError) for k, v in outcomes.items() if k not in won)
    assert [r.pipeline_key for r in ranges_of_pipeline(engine, won[0])] == won
