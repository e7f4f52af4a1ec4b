"""A tiny pipeline for the clear-recomputes / retry-resumes end-to-end test
(tests/e2e/test_clear_recompute.py), parsed by the stop/resume tests' cluster:

``numbers`` (splits n1..n4, one row and one output part each) -> ``scaled`` (n * the factor in
``<work>/rerun/factor``: the "logic" a test changes between runs; no downstream, so its output
parts are its result) and ``numbers`` -> ``published`` (a Parquet sink declaring no slice).
``scaled`` can be held after its first batch (``<work>/rerun/hold``) so the test kills it there;
``published`` marks each commit with the Asset ``finalckpt_e2e_rerun_published`` and fails every
batch after its first while ``<work>/rerun/fail-published`` exists (its
tries fail for good, then a clear resumes it).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset

from airflow_finalckpt.decorators import finalckpt_stage
from airflow_finalckpt.sinks import ParquetTableSink

WORK = Path(os.environ.get("FINALCKPT_E2E_WORK", "/tmp/finalckpt-e2e-stop")) / "rerun"
RERUN_DAG = "finalckpt_e2e_rerun"


def _factor() -> int:
    path = WORK / "factor"
    return int(path.read_text().strip()) if path.exists() else 2


def _hold(_ctx: Any) -> None:
    """While ``hold`` exists, every batch after the first waits (the test kills the try there)."""
    marker = WORK / "hold"
    if not marker.exists():
        return
    first = WORK / "first-batch-done"
    if not first.exists():
        first.write_text("1")
        return
    (WORK / "held").write_text(str(os.getpid()))
    deadline = time.monotonic() + 300
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def _fail_after_first_batch() -> None:
    """While ``fail-published`` exists, every batch of ``published`` after its first fails."""
    if not (WORK / "fail-published").exists():
        return
    first = WORK / "published-first-batch"
    if not first.exists():
        first.write_text("1")
        return
    raise RuntimeError("published fails on purpose while fail-published exists")


with DAG(
    RERUN_DAG,
    schedule=None,
    catchup=False,
    tags=["e2e"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=1)},
):

    @finalckpt_stage(splits=["n1", "n2", "n3", "n4"], batch_size=1)
    def numbers(ctx: Any) -> Any:
        rows = [(s, int(s[1:])) for s in ctx.splits]
        return ctx.spark.createDataFrame(rows, "split string, n long")

    @finalckpt_stage(batch_size=1)
    def scaled(ctx: Any) -> Any:
        from pyspark.sql import functions as F

        _hold(ctx)
        return ctx.read_parts().withColumn("value", F.col("n") * F.lit(_factor()))

    @finalckpt_stage(
        batch_size=2,
        sinks=[ParquetTableSink("out", str(WORK / "published"))],
        outlets=[Asset("finalckpt_e2e_rerun_published")],
    )
    def published(ctx: Any) -> Any:
        _fail_after_first_batch()
        return ctx.read_parts()

    source = numbers()
    source >> scaled()
    source >> published()
