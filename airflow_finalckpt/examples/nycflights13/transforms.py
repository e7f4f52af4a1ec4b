"""The example's stage logic as pure functions on PySpark DataFrames.

``ingest`` reads day files, ``enrich`` joins the dimension tables, ``delay_windows`` aggregates
hourly per origin airport with the reusable event-time window operator. The runtime around them
owns batching, state files, checkpoints and sinks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import reduce
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from airflow_finalckpt.examples.nycflights13.data import (
    DIMENSION_TABLES,
    EVENT_TIME_COLUMN,
    WEATHER_HOUR_COLUMN,
    CorruptInputError,
    ExampleDataError,
    InputLayout,
    dim_path,
    split_id_of_path,
)
from airflow_finalckpt.spark.windows import Aggregate, WindowSpec, WindowStep, advance, flush

SPLIT_ID_COLUMN = "split_id"
#: A day file's name (``day=YYYY-MM-DD.parquet``, see data.split_id_of_path) -> its split id.
_DAY_FILE_PATTERN = r"^day=(\d{4}-\d{2}-\d{2})\.parquet$"
HOUR_MS = 3_600_000

_LONG, _DOUBLE, _STRING = LongType(), DoubleType(), StringType()

#: The flight columns ``ingest`` keeps, with the types a day file must have.
FLIGHT_COLUMNS: dict[str, DataType] = {
    "year": _LONG,
    "month": _LONG,
    "day": _LONG,
    "dep_time": _DOUBLE,
    "sched_dep_time": _LONG,
    "dep_delay": _DOUBLE,
    "arr_time": _DOUBLE,
    "sched_arr_time": _LONG,
    "arr_delay": _DOUBLE,
    "carrier": _STRING,
    "flight": _LONG,
    "tailnum": _STRING,
    "origin": _STRING,
    "dest": _STRING,
    "air_time": _DOUBLE,
    "distance": _LONG,
    EVENT_TIME_COLUMN: _LONG,
}

#: Per dimension table: the columns enrich reads (with types) and its join key.
DIM_COLUMNS: dict[str, dict[str, DataType]] = {
    "airlines": {"carrier": _STRING, "name": _STRING},
    "airports": {"faa": _STRING, "name": _STRING},
    "planes": {"tailnum": _STRING, "manufacturer": _STRING, "seats": _LONG},
    "weather": {
        "origin": _STRING,
        WEATHER_HOUR_COLUMN: _LONG,
        "temp": _DOUBLE,
        "wind_speed": _DOUBLE,
        "precip": _DOUBLE,
        "visib": _DOUBLE,
    },
}
DIM_KEYS: dict[str, tuple[str, ...]] = {
    "airlines": ("carrier",),
    "airports": ("faa",),
    "planes": ("tailnum",),
    "weather": ("origin", WEATHER_HOUR_COLUMN),
}

#: The columns enrich adds to every flight (null where the dimension has no match).
ENRICHMENT_COLUMNS = (
    "carrier_name",
    "origin_name",
    "dest_name",
    "plane_manufacturer",
    "plane_seats",
    "temp",
    "wind_speed",
    "precip",
    "visib",
)
ENRICHED_COLUMNS = (*FLIGHT_COLUMNS, SPLIT_ID_COLUMN, *ENRICHMENT_COLUMNS)

#: Hourly windows per origin airport. Day files arrive in event-time order and a day's flights
#: all precede the next day's, so a small out-of-orderness bound only delays firing a little.
DELAY_WINDOW_SPEC = WindowSpec(
    key_columns=("origin",),
    time_column=EVENT_TIME_COLUMN,
    size_ms=HOUR_MS,
    out_of_orderness_ms=15 * 60_000,
    allowed_lateness_ms=0,
)
DELAY_AGGREGATES: tuple[Aggregate, ...] = (
    Aggregate.count("flights"),
    Aggregate.sum("cancelled", "cancelled"),
    Aggregate.avg("avg_dep_delay", "dep_delay"),
    Aggregate.max("max_dep_delay", "dep_delay"),
    Aggregate.avg("avg_arr_delay", "arr_delay"),
    Aggregate.sum("total_seats", "plane_seats"),
)


class InputSchemaError(CorruptInputError):
    """A day or dimension file lacks a column or holds it with the wrong type."""

    def __init__(self, path: str | Path, column: str, detail: str) -> None:
        self.column = column
        super().__init__(path, f"column {column!r} {detail}")


class DimensionKeyError(ExampleDataError):
    """A dimension table has duplicate join keys: joining it would duplicate flights."""


def ingest(spark: SparkSession, paths: Sequence[str | Path]) -> DataFrame:
    """The flights of the given day files with their ``split_id``, schema checked per file.

    Each file's schema is checked from its Parquet footer (no Spark job per file), then all are
    read as one Spark scan; the split id comes from each row's file name.
    """
    if not paths:
        raise ValueError("ingest needs at least one day file")
    split_ids = [split_id_of_path(path) for path in paths]
    repeated = sorted({split for split in split_ids if split_ids.count(split) > 1})
    if repeated:
        raise ExampleDataError(f"day files given twice for splits {repeated}: rows would repeat")
    for path in paths:
        check_schema(_footer_schema(str(path)), FLIGHT_COLUMNS, path)
    try:
        frame = spark.read.parquet(*[str(path) for path in paths])
    except Exception as exc:  # Py4J, AnalysisException or a Spark Connect error
        raise CorruptInputError(paths[0], f"day files not readable ({_gist(exc)})") from exc
    split = F.regexp_extract(F.col("_metadata.file_name"), _DAY_FILE_PATTERN, 1)
    return frame.select(*FLIGHT_COLUMNS, split.alias(SPLIT_ID_COLUMN))


def _footer_schema(path: str) -> StructType:
    """A Parquet file's schema in Spark types, read from its footer alone."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_type

    try:
        schema = pq.read_schema(path)
    except Exception as exc:
        raise CorruptInputError(path, f"not a readable Parquet file ({_gist(exc)})") from exc
    fields = []
    for field in schema:
        try:
            spark_type = from_arrow_type(field.type)
        except Exception:  # a type Spark cannot read: reported as its Arrow name
            spark_type = _UnknownType(str(field.type))
        fields.append(StructField(field.name, spark_type))
    return StructType(fields)


class _UnknownType(DataType):
    def __init__(self, name: str) -> None:
        self._name = name

    def simpleString(self) -> str:
        return self._name


def load_dims(spark: SparkSession, layout: InputLayout) -> dict[str, DataFrame]:
    """The dimension tables enrich needs, reduced to the columns it reads, schema checked."""
    return {name: load_dim(spark, layout, name) for name in DIMENSION_TABLES}


def load_dim(spark: SparkSession, layout: InputLayout, name: str) -> DataFrame:
    """One dimension table (``airlines``, ``airports``, ``planes`` or ``weather``)."""
    return _read_checked(spark, str(dim_path(layout, name)), DIM_COLUMNS[name])


def enrich(
    spark: SparkSession,
    flights: DataFrame,
    dims: Mapping[str, DataFrame],
    *,
    verify_keys: bool = True,
) -> DataFrame:
    """Flights joined (left, broadcast) with carrier, airport, plane and weather attributes.

    Every flight stays exactly once: each dimension's join key must be unique, else
    DimensionKeyError. That check costs one small Spark job; a caller that already verified
    the same dims (``verify_dims``) may pass ``verify_keys=False``. Flights join weather on
    origin and the UTC hour of ``event_time_ms``. ``spark`` is unused; it keeps the stage
    functions' signatures uniform.
    """
    del spark
    missing = sorted(set(DIMENSION_TABLES) - set(dims))
    if missing:
        raise ExampleDataError(f"enrich needs the dimension tables {missing}")
    if verify_keys:
        verify_dims(dims)

    airlines = dims["airlines"].select("carrier", F.col("name").alias("carrier_name"))
    origins = dims["airports"].select(
        F.col("faa").alias("origin"), F.col("name").alias("origin_name")
    )
    dests = dims["airports"].select(F.col("faa").alias("dest"), F.col("name").alias("dest_name"))
    planes = dims["planes"].select(
        "tailnum",
        F.col("manufacturer").alias("plane_manufacturer"),
        F.col("seats").alias("plane_seats"),
    )
    weather = dims["weather"].select(*DIM_COLUMNS["weather"])

    event_time = F.col(EVENT_TIME_COLUMN)
    hourly = flights.withColumn(
        WEATHER_HOUR_COLUMN, event_time - F.pmod(event_time, F.lit(HOUR_MS).cast("long"))
    )
    joined = (
        hourly.join(F.broadcast(airlines), on="carrier", how="left")
        .join(F.broadcast(origins), on="origin", how="left")
        .join(F.broadcast(dests), on="dest", how="left")
        .join(F.broadcast(planes), on="tailnum", how="left")
        .join(F.broadcast(weather), on=["origin", WEATHER_HOUR_COLUMN], how="left")
    )
    return joined.select(*ENRICHED_COLUMNS)


def weather_by_origin(
    spark: SparkSession, layout: InputLayout, origins: Sequence[str]
) -> DataFrame:
    """The weather dimension's rows of the given origin airports (the branching example's
    ``weather`` source stage: one split per origin), with the columns enrich joins on.
    """
    if not origins:
        raise ValueError("weather_by_origin needs at least one origin airport")
    weather = load_dim(spark, layout, "weather")
    return weather.where(F.col("origin").isin(list(origins)))


#: The daily per-carrier aggregate of the branching example (one row per day and carrier).
CARRIER_DAILY_KEY = ("day", "carrier")
CARRIER_DAILY_COLUMNS = (
    "day",
    "carrier",
    "carrier_name",
    "flights",
    "cancelled",
    "avg_dep_delay",
)


def carrier_daily(enriched: DataFrame) -> DataFrame:
    """Flights, cancelled flights and average departure delay per carrier and day.

    ``day`` is the flight's split id (its local day). Exact per batch of enriched parts: every
    part holds whole days (ingest's splits are days), so no (day, carrier) group spans batches.
    """
    return (
        enriched.groupBy(F.col(SPLIT_ID_COLUMN).alias("day"), "carrier", "carrier_name")
        .agg(
            F.count(F.lit(1)).alias("flights"),
            F.sum(F.col("dep_time").isNull().cast("long")).alias("cancelled"),
            F.avg("dep_delay").alias("avg_dep_delay"),
        )
        .select(*CARRIER_DAILY_COLUMNS)
    )


def verify_dims(dims: Mapping[str, DataFrame]) -> None:
    """Check every dimension's join key is unique (DimensionKeyError otherwise)."""
    assert_unique_keys({name: (dims[name], DIM_KEYS[name]) for name in DIMENSION_TABLES})


def assert_unique_keys(tables: Mapping[str, tuple[DataFrame, Sequence[str]]]) -> None:
    """Refuse dimensions whose non-null join key repeats (a left join would duplicate rows).

    ``tables`` maps a table name to the frame and its key; all are checked in one Spark job.
    """
    checks = []
    for name, (dim, keys) in tables.items():
        complete = dim.where(reduce(lambda a, b: a & b, [F.col(key).isNotNull() for key in keys]))
        duplicates = complete.groupBy(*keys).count().where(F.col("count") > 1)
        checks.append(
            duplicates.select(
                F.lit(name).alias("table"), F.to_json(F.struct(*keys)).alias("key")
            ).limit(3)
        )
    found = reduce(DataFrame.unionByName, checks).collect() if checks else []
    if found:
        examples = "; ".join(f"{row['table']} {row['key']}" for row in found)
        names = sorted({row["table"] for row in found})
        raise DimensionKeyError(
            f"dimension tables {names} have duplicate join keys, e.g. {examples}: "
            "joining them would duplicate flights"
        )


def delay_windows(
    enriched: DataFrame,
    state: DataFrame | None,
    watermark: int | None,
    *,
    spec: WindowSpec = DELAY_WINDOW_SPEC,
    final: bool = False,
) -> WindowStep:
    """Advance the hourly per-origin delay windows by one batch of enriched flights
    (``final``: the last batch of the input, every window fires).
    """
    with_cancelled = enriched.withColumn("cancelled", F.col("dep_time").isNull().cast("long"))
    return advance(with_cancelled, state, watermark, spec, DELAY_AGGREGATES, final=final)


def flush_delay_windows(state: DataFrame, *, spec: WindowSpec = DELAY_WINDOW_SPEC) -> DataFrame:
    """Fire every open delay window (drain or end of input)."""
    return flush(state, spec, DELAY_AGGREGATES)


def _read_checked(spark: SparkSession, path: str, columns: Mapping[str, DataType]) -> DataFrame:
    """Read one Parquet file, check the needed columns' presence and types, keep only them."""
    try:
        frame = spark.read.parquet(path)
    except Exception as exc:  # Py4J, AnalysisException or a Spark Connect error
        raise CorruptInputError(path, f"not a readable Parquet file ({_gist(exc)})") from exc
    check_schema(frame.schema, columns, path)
    return frame.select(*columns)


def check_schema(schema: StructType, columns: Mapping[str, DataType], path: str | Path) -> None:
    """Raise InputSchemaError naming the file and the first missing or mistyped column."""
    found = {field.name: field.dataType for field in schema.fields}
    for column, expected in columns.items():
        if column not in found:
            raise InputSchemaError(path, column, "is missing")
        if found[column] != expected:
            raise InputSchemaError(
                path,
                column,
                f"has type {found[column].simpleString()}, expected {expected.simpleString()}",
            )


def _gist(error: Exception, limit: int = 400) -> str:
    """The first message lines of a (possibly Java) error, without its stack trace."""
    lines = [line.strip() for line in str(error).splitlines()]
    message = [line for line in lines if line and not line.startswith("at ")][:3]
    return (" ".join(message) or type(error).__name__)[:limit]
