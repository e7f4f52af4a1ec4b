"""A small finalckpt producer and an Asset-scheduled consumer for tests/e2e/test_asset_consumer.py.

- ``finalckpt_e2e_asset_producer``: one stage, three splits in two batches, committed to a
  Parquet table at its final checkpoint; its Asset ``finalckpt_e2e_asset`` marks the commit;
- ``finalckpt_e2e_asset_consumer``: ``schedule=[Asset("finalckpt_e2e_asset")]``; its task
  writes the Asset events that triggered it to ``$FINALCKPT_E2E_WORK/consumed/<run id>.json``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, task

from airflow_finalckpt.operators.stage import FinalCheckpointStageOperator
from airflow_finalckpt.sinks import ParquetTableSink

WORK = Path(os.environ.get("FINALCKPT_E2E_WORK", "/tmp/finalckpt-e2e-assets"))
ASSET = Asset("finalckpt_e2e_asset")
PRODUCER = "finalckpt_e2e_asset_producer"
CONSUMER = "finalckpt_e2e_asset_consumer"
#: Few shuffle partitions and no UI: the data is tiny and the machine busy.
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}


def rows(ctx: Any) -> Any:
    return ctx.spark.createDataFrame([(s, len(s)) for s in ctx.splits], "k string, n long")


with DAG(PRODUCER, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as producer:
    FinalCheckpointStageOperator(
        task_id="publish",
        transform=rows,
        splits=["a", "bb", "ccc"],
        batch_size=2,
        commit_mode="final",
        outlets=[ASSET],
        sinks=[ParquetTableSink("keys", str(WORK / "keys"))],
        spark_conf=SPARK_CONF,
        retries=0,
    )


with DAG(CONSUMER, schedule=[ASSET], start_date=datetime(2026, 1, 1), catchup=False) as consumer:

    @task
    def consume(**context: Any) -> None:
        events = [
            {"extra": dict(event.extra or {}), "source_run_id": event.source_run_id}
            for events in context["triggering_asset_events"].values()
            for event in events
        ]
        out = WORK / "consumed"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{context['run_id']}.json").write_text(json.dumps(events))

    consume()
