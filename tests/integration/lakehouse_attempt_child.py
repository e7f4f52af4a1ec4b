"""Child process of test_sinks_lakehouse_bad_input: ONE attempt of the fault campaign's small
pipeline (real StageRunner, coordinator, checkpoint storage; pandas instead of Spark) whose last
stage publishes to one Iceberg or Delta sink, as an Airflow task attempt would run it.

Usage: ``python lakehouse_attempt_child.py <config.json>``; the config names the run's store,
storage, pipeline key and the sink (``kind``, ``root``, optional ``catalog``). Prints
``completed`` or ``failed <ExceptionType>: <message>`` as its last line; exit status 0 either way.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from airflow_finalckpt.coordination import Coordinator
from airflow_finalckpt.runtime.runner import CommitMode
from airflow_finalckpt.sinks import DeltaTableSink, IcebergTableSink
from airflow_finalckpt.sinks.staged import StagedTableSink
from airflow_finalckpt.storage import CheckpointStorage
from airflow_finalckpt.store.engine import make_engine
from faults.fake import FakeData, FakePipeline


def make_table_sink(config: dict[str, Any]) -> StagedTableSink:
    root = config["root"]
    if config["kind"] == "iceberg":
        return IcebergTableSink(
            "windows",
            "faults.windows",
            warehouse=f"{root}/warehouse",
            catalog=config.get("catalog"),
        )
    return DeltaTableSink("windows", f"{root}/delta/windows")


def main(config: dict[str, Any]) -> str:
    engine = make_engine(config["store_url"])
    try:
        pipeline = FakePipeline(
            Coordinator(engine, config["pipeline_key"]),
            CheckpointStorage(config["storage_root"]),
            [make_table_sink(config)],
            data=FakeData(splits=4),
            batch_sizes={"gen": 2, "agg": 2, "publish": 1},
            commit_mode=CommitMode.PROGRESSIVE,
            checkpoint_interval_s=0.0,
            close_timeout_s=60.0,
        )
        try:
            pipeline.run()
        except Exception as exc:
            return f"failed {type(exc).__name__}: {exc}"
        return "completed"
    finally:
        engine.dispose()


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        print(main(json.load(handle)), flush=True)
