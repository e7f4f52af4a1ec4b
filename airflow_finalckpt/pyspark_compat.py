"""The few PySpark calls that differ between pyspark 3.5 and 4.x, in one place.

A submitted stage's driver and executors run the cluster's pyspark (EMR 7 and Dataproc 2.2 run
Spark 3.5), not the Airflow task's: the driver side (spark/, runtime/, the sinks' Spark code)
goes through these helpers for every 4.x-only API. CI's spark35 lane runs the driver-side tests
on pyspark 3.5 (docs/compatibility.md). Imports nothing of the product.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


def arrow_schema(schema: StructType, timezone: str = "UTC") -> pa.Schema:
    """Spark's Arrow schema of ``schema``; timestamps carry ``timezone`` (pyspark 3.5, which
    has no ``timezone`` argument, always labels them UTC: the same instants).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(schema, timezone=timezone)
    return to_arrow_schema(schema)  # pyspark < 4.0


def to_arrow(df: DataFrame) -> pa.Table:
    """Collect ``df`` to the driver as an Arrow table (``DataFrame.toArrow`` is 4.0+; 3.5 has
    the same collection under its internal name ``_collect_as_arrow``).
    """
    if hasattr(df, "toArrow"):
        return df.toArrow()
    import pyarrow as pa

    batches: list[Any] = cast(Any, df)._collect_as_arrow()
    schema = arrow_schema(df.schema)
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()


def local_copy(spark: SparkSession, df: DataFrame) -> DataFrame:
    """``df`` collected once and held by the driver (a local relation): reading it again runs
    no job over its sources. 4.x builds it from Arrow; 3.5 (no Arrow tables in
    ``createDataFrame``, whose Python rows become an RDD) from the rows collected in the JVM.
    """
    if hasattr(df, "toArrow"):
        return spark.createDataFrame(df.toArrow(), schema=df.schema)
    from pyspark.sql import DataFrame

    jdf = df._jdf
    local = spark._jsparkSession.createDataFrame(jdf.collectAsList(), jdf.schema())
    return DataFrame(local, spark)
