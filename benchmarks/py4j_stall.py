"""The py4j 40 ms stall, measured (issue 29; not part of the suite).

py4j 0.10.9.x writes a reply longer than its 8 KB buffer in two writes; with Nagle's algorithm on
the JVM's socket and delayed ACKs on the Python side the second write waits ~40 ms (py4j issue
516). The plan check reads each batch's plan as JSON (14-90 KB at the example's stages), so it
paid that wait once or twice per stage; ``spark.py4j_nodelay`` turns Nagle off on the stage's
connection. This times py4j calls whose reply is a string of a given length, on a fresh
connection (a new Python thread) with Nagle on and then off, and the plan check's JSON reads of
the example's delay_windows stage the same way.

``python -m benchmarks.py4j_stall [--repeat 20 --out FILE]``: JSON, median milliseconds per call
(docs/benchmarks.md, "The py4j 40 ms stall").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_finalckpt.spark.py4j_nodelay import disable_nagle
from benchmarks.common import emit_json, spark_session

SIZES = (1_000, 8_000, 9_000, 16_000, 64_000, 256_000)


def _median_ms(call: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000.0)
    return round(statistics.median(samples), 3)


def _plan_frames(spark: Any) -> dict[str, Any]:
    """Frames like delay_windows' batch: a Parquet read (its plan names its files) and the
    windows' aggregate over it, as the plan check reads them (``toJSON`` of the analyzed plan).
    """
    import tempfile

    from pyspark.sql import functions as F

    path = str(Path(tempfile.mkdtemp()) / "parts")
    rows = spark.range(20_000).select(
        (F.col("id") % 100).cast("string").alias("origin"),
        F.timestamp_seconds(F.col("id") * 60).alias("ts"),
        (F.col("id") % 7).alias("dep_delay"),
    )
    rows.write.parquet(path)
    read = spark.read.parquet(path)
    windows = read.groupBy("origin", F.window("ts", "1 hour")).agg(F.avg("dep_delay"))
    return {"parquet read": read, "windows aggregate": windows}


def measure(repeat: int) -> dict[str, Any]:
    """Per reply size (and per plan), median ms with Nagle on, then off, on a fresh connection."""
    spark = spark_session()
    jvm = spark.sparkContext._jvm
    frames = _plan_frames(spark)
    out: dict[str, Any] = {}

    def probe() -> None:
        def calls() -> dict[str, Callable[[], object]]:
            found: dict[str, Callable[[], object]] = {
                f"string reply {size} chars": (
                    lambda size=size: jvm.org.apache.commons.lang3.StringUtils.repeat("x", size)
                )
                for size in SIZES
            }
            for name, frame in frames.items():
                found[f"plan JSON, {name}"] = lambda frame=frame: (
                    frame._jdf.queryExecution().analyzed().toJSON()
                )
            return found

        nagle = {name: _median_ms(call, repeat) for name, call in calls().items()}
        out["nodelay_set"] = disable_nagle(spark)
        nodelay = {name: _median_ms(call, repeat) for name, call in calls().items()}
        out["median_ms"] = {
            name: {"nagle_on": nagle[name], "nagle_off": nodelay[name]} for name in nagle
        }
        out["plan_json_chars"] = {
            name: len(frame._jdf.queryExecution().analyzed().toJSON())
            for name, frame in frames.items()
        }

    thread = threading.Thread(target=probe)  # a new thread: a new py4j connection, Nagle on
    thread.start()
    thread.join()
    return {"repeat": repeat, **out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    return emit_json(measure(args.repeat), args.out)


if __name__ == "__main__":
    sys.exit(main())
