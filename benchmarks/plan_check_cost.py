"""The plan check's cost per batch (docs/benchmarks.md "Plan check"): the example pipeline on
``local[2]`` with one day per batch in every stage; per stage, the milliseconds of the check
(plan translation + classification, ``SparkStageLogic.check_ms``) against the batch's own work
(``SparkStageLogic.process``), and the whole ``check_plan`` call: the transform called under the
rule driver-action-on-batch's watch (``spark.driver_actions``), then the check.

    .venv/bin/python -m benchmarks.plan_check_cost [days]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.examples.nycflights13.data import first_days, prepare_inputs
from airflow_finalckpt.examples.nycflights13.local import run_example_locally
from airflow_finalckpt.sinks import ParquetTableSink
from airflow_finalckpt.spark.stage import SparkStageLogic
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema

STAGES = ("ingest", "enrich", "delay_windows", "publish")


def measure(days: int) -> dict[str, dict[str, float]]:
    """Per stage: check ms (first batch, median and max of the others), batch work ms, and
    the median ms of the call that builds the frame (transform + watch) and checks it.
    """
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work: dict[str, list[float]] = {}
    checks: dict[str, list[float]] = {}
    process = SparkStageLogic.process

    def timed(self: SparkStageLogic, batch: Any, txn_ids: Any) -> Any:
        started = time.perf_counter()
        out = process(self, batch, txn_ids)
        work.setdefault(self.stage_id, []).append((time.perf_counter() - started) * 1000)
        checks[self.stage_id] = list(self.check_ms)
        return out

    SparkStageLogic.process = timed  # type: ignore[method-assign]
    check_plan = SparkStageLogic.check_plan
    calls: dict[str, list[float]] = {}

    def timed_check(self: SparkStageLogic, batch: Any) -> Any:
        started = time.perf_counter()
        out = check_plan(self, batch)
        calls.setdefault(self.stage_id, []).append((time.perf_counter() - started) * 1000)
        return out

    SparkStageLogic.check_plan = timed_check  # type: ignore[method-assign]
    tmp = Path(tempfile.mkdtemp())
    prepare_inputs(tmp / "in", days=first_days(days))
    engine = make_engine(f"sqlite:///{tmp}/store.db")
    ensure_schema(engine)
    storage = CheckpointStorage(str(tmp / "checkpoints"))
    run_example_locally(
        spark,
        str(tmp / "in"),
        Coordinator(engine, "plan-check-cost", writer=storage),
        storage,
        [ParquetTableSink("out", str(tmp / "out"))],
        batch_sizes=dict.fromkeys(STAGES, 1),
    )
    result = {}
    for stage in STAGES:
        ms, rest = checks[stage], checks[stage][1:] or checks[stage]
        result[stage] = {
            "batches": len(ms),
            "first_ms": ms[0],
            "median_ms": statistics.median(rest),
            "max_ms": max(rest),
            "work_ms": statistics.median(work[stage][1:] or work[stage]),
            "call_ms": statistics.median(calls[stage][1:] or calls[stage]),
        }
    return result


def main() -> None:
    """Print one line per stage."""
    for stage, row in measure(int(sys.argv[1]) if len(sys.argv) > 1 else 12).items():
        share = 100 * row["median_ms"] / row["work_ms"]
        print(
            f"{stage}: {row['batches']:.0f} batches; check first {row['first_ms']:.0f} ms, then "
            f"median {row['median_ms']:.0f} ms (max {row['max_ms']:.0f}); batch work median "
            f"{row['work_ms']:.0f} ms: the check is {share:.1f}% of it; transform call + "
            f"check median {row['call_ms']:.0f} ms"
        )


if __name__ == "__main__":
    main()
