"""`finalckpt sources list|show` on cursors and ranges written by the real claim and advance
(SQLite and PostgreSQL): positions, open and committed ranges, a drained run's partial read,
an unknown cursor refused in one line; nothing is changed by reading.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from click.testing import CliRunner

from airflow_finalckpt.cli.main import main
from airflow_finalckpt.core.model import StageLifecycle
from airflow_finalckpt.core.source_cursor import Cursor, Listing, SourceFile
from airflow_finalckpt.store.cursors import claim_range, read_cursor, settle_ranges
from airflow_finalckpt.store.engine import make_engine


def _files(*names: str) -> tuple[SourceFile, ...]:
    return tuple(SourceFile(split_id=f"file:///t/{n}", identity=f"/t/{n}") for n in names)


def _claim(engine, cursor_id: str, kind: str, key: str, listing: Listing) -> None:  # type: ignore[no-untyped-def]
    claim_range(
        engine,
        cursor_id=cursor_id,
        kind=kind,
        pipeline_key=key,
        stage_id="read",
        lister=lambda _cursor: listing,
        now=lambda: 1_700_000_000.0,
        dag_id="daily",
        run_id=key,
        logical_date=f"2026-01-0{key[-1]}T00:00:00+00:00",
    )


def _close(engine, key: str, read: list[str]) -> list[Cursor]:  # type: ignore[no-untyped-def]
    """The pipeline's last close: every stage CLOSED, the source stage finished ``read``."""
    row = SimpleNamespace(final_snapshot=SimpleNamespace(finished_splits=frozenset(read)))
    with engine.begin() as conn:
        return settle_ranges(
            conn, key, {"read": StageLifecycle.CLOSED}, lambda _stage: row, 1_700_000_100.0
        )


def test_list_and_show_tell_positions_and_ranges(store_url: str) -> None:
    engine = make_engine(store_url)
    _claim(engine, "daily.read", "delta", "run-1", Listing(newest=4, files=_files("a", "b", "c")))
    (moved,) = _close(engine, "run-1", ["file:///t/a", "file:///t/b"])  # drained after two
    assert moved.version == 1
    _claim(engine, "daily.read", "delta", "run-2", Listing(newest=6, files=_files("c", "d")))
    _claim(engine, "landing.read", "landing", "run-9", Listing(newest=None, files=_files("x")))
    before = read_cursor(engine, "daily.read")

    listed = CliRunner().invoke(main, ["sources", "list", "--json", "--store-url", store_url])
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.output)
    assert doc["total_entries"] == 2
    daily, landing = doc["cursors"]
    assert (daily["cursor_id"], daily["kind"], daily["version"]) == ("daily.read", "delta", 1)
    assert daily["advanced_by"] == "run-1" and daily["ranges"] == 2
    assert [r["pipeline_key"] for r in daily["open_ranges"]] == ["run-2"]
    assert daily["open_ranges"][0]["files"] == 2 and "splits" not in daily["open_ranges"][0]
    assert landing["version"] == 0 and landing["open_ranges"][0]["run_id"] == "run-9"

    table = CliRunner().invoke(main, ["sources", "list", "--store-url", store_url])
    assert table.exit_code == 0, table.output
    assert "daily.read" in table.output and "daily/run-2 (2 files" in table.output

    shown = CliRunner().invoke(
        main, ["sources", "show", "daily.read", "--json", "--store-url", store_url]
    )
    assert shown.exit_code == 0, shown.output
    history = json.loads(shown.output)["history"]
    assert [(r["pipeline_key"], r["state"], r["read"]) for r in history] == [
        ("run-1", "COMMITTED", 2),  # the drained run advanced over two of its three files
        ("run-2", "OPEN", None),
    ]
    assert history[0]["splits"] == ["file:///t/a", "file:///t/b", "file:///t/c"]
    text = CliRunner().invoke(main, ["sources", "show", "daily.read", "--store-url", store_url])
    assert text.exit_code == 0 and "2 ranges" in text.output, text.output
    assert read_cursor(engine, "daily.read") == before  # reading changed nothing
    engine.dispose()


def test_show_refuses_an_unknown_cursor_in_one_line(store_url: str) -> None:
    result = CliRunner().invoke(main, ["sources", "show", "nope", "--store-url", store_url])
    assert result.exit_code == 2
    assert "no source cursor 'nope'" in result.output and "Traceback" not in result.output
