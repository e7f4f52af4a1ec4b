"""The route totals example DAG (an incremental aggregation over every day) through real Airflow
``dag.test()``, real Spark and real sinks: with a fixed batch of one day, the Parquet table and
the SQL table upserted on the route hold one row per route, equal to an independent pandas
groupBy over all days. (A plain groupBy is refused with ``batch_size=1`` by the plan check;
returned per batch it would commit one row per route and day.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_finalckpt.examples.nycflights13.data import (
    EVENT_TIME_COLUMN,
    open_layout,
    read_split,
)

pytestmark = pytest.mark.slow

DAYS = 3
DAG_SOURCE = """
from airflow_finalckpt.examples.nycflights13.route_totals import build_route_totals_dag

dag = build_route_totals_dag(
    DAG_ID, input_dir=INPUT, output_dir=OUTPUT, days=DAYS, retries=0,
    batch_sizes={"ingest": 1, "route_totals": 1},
)
"""
COLUMNS = [
    "origin",
    "dest",
    "flights",
    "cancelled",
    "distance",
    "avg_arr_delay",
    "max_dep_delay",
    "carriers",
    "first_flight",
    "last_flight",
]


def _reference(input_dir: Path) -> pd.DataFrame:
    layout = open_layout(input_dir)
    flights = pd.concat([read_split(layout, s) for s in layout.split_ids], ignore_index=True)
    flights["cancelled"] = flights["dep_time"].isna().astype("int64")
    flights["flight_code"] = flights["carrier"] + flights["flight"].astype(str)
    flights["departure_key"] = (
        flights[EVENT_TIME_COLUMN].map("{:013d}".format)
        + " "
        + flights["carrier"]
        + flights["flight"].map("{:05d}".format)
    )
    assert flights["departure_key"].is_unique
    routes = flights.groupby(["origin", "dest"])
    by_key = flights.set_index("departure_key")["flight_code"]
    reference = pd.DataFrame(
        {
            "flights": routes.size(),
            "cancelled": routes["cancelled"].sum(),
            "distance": routes["distance"].sum(),
            "avg_arr_delay": routes["arr_delay"].mean(),
            "max_dep_delay": routes["dep_delay"].max(),
            "carriers": routes["carrier"].nunique(),
            "first_flight": routes["departure_key"].min().map(by_key),
            "last_flight": routes["departure_key"].max().map(by_key),
        }
    ).reset_index()
    return _sorted(reference)


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[COLUMNS].sort_values(["origin", "dest"]).reset_index(drop=True)


def test_route_totals_equal_pandas_with_one_day_per_batch(
    write_dag: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_finalckpt.examples.nycflights13.route_totals import route_totals_sinks

    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORE_URL", f"sqlite:///{tmp_path}/coordination.db")
    monkeypatch.setenv("AIRFLOW__FINALCKPT__STORAGE_URI", str(tmp_path / "checkpoints"))
    output = tmp_path / "output"
    dag = write_dag(
        DAG_SOURCE,
        DAG_ID=f"route_totals_{uuid.uuid4().hex[:8]}",
        INPUT=str(tmp_path / "input"),
        OUTPUT=str(output),
        DAYS=DAYS,
    )
    run = dag.test(run_conf={"pipeline_key": f"routes-{uuid.uuid4().hex[:8]}"})
    assert str(run.state).endswith("success"), run.state

    expected = _reference(tmp_path / "input")
    assert len(expected) > 50 and expected["flights"].sum() > 2000
    parquet, sql = route_totals_sinks(str(output))
    for sink in (parquet, sql):
        actual = _sorted(sink.read_pandas())
        pd.testing.assert_frame_equal(actual, expected, check_dtype=False, rtol=1e-9)
    schema = {f.name: str(f.type) for f in parquet.read_arrow().schema}
    assert schema["flights"] == "int64" and schema["avg_arr_delay"] == "double"
