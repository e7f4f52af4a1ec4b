"""Child process of test_incremental_sigkill: one attempt of one scheduled run of the
incremental landing pipeline (``incremental_pipeline``) that SIGKILLs itself at a point, like a
killed Airflow worker.

Usage: ``python -m tests.spark.incremental_kill_child <root> <run key> <stage:point|none>``.
``publish:in-close`` dies inside the database transaction of the pipeline's last close, after
the cursor's advance was written and before the transaction commits.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from airflow_finalckpt.coordination import coordinator as coordinator_module
from airflow_finalckpt.sinks.parquet import ParquetTableSink
from airflow_finalckpt.sources import LandingDirectory
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from airflow_finalckpt.store.migrate import ensure_schema
from tests.spark.incremental_pipeline import IncrementalEnv, run_pipeline


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    root, key, where = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    engine = make_engine(f"sqlite:///{root}/store.db")
    ensure_schema(engine)
    env = IncrementalEnv(
        engine=engine,
        storage=CheckpointStorage(str(root / "checkpoints")),
        sink=ParquetTableSink("out", str(root / "out")),
        source=LandingDirectory(f"file://{root}/landing", pattern="*.parquet"),
    )
    if where == "publish:in-close":
        settle = coordinator_module.settle_ranges

        def settle_then_die(conn, key, lifecycles, stage_row, now):  # type: ignore[no-untyped-def]
            advanced = settle(conn, key, lifecycles, stage_row, now)
            if advanced:  # the advance is written, the close transaction not committed
                die()
            return advanced

        coordinator_module.settle_ranges = settle_then_die  # type: ignore[assignment]

    def fault(stage: str, point: str) -> None:
        if f"{stage}:{point}" == where:
            die()

    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    run_pipeline(spark, env, key, fault=fault)
    print("done")
    spark.stop()


if __name__ == "__main__":
    main()
