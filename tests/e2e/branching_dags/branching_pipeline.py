"""A copy of the branching example pipeline for tests/e2e/test_example_pipeline.py, paced by
gates the test opens or never opens (files under ``$FINALCKPT_E2E_WORK/gates``), so what runs
at the same time does not depend on the machine's load:

- ``carrier_daily`` (one split per batch) holds its last batch while ``gates/carrier_daily``
  exists: the test lets it finish only once ``delay_windows`` has recorded a batch and is
  inside its next one;
- ``delay_windows``'s first try holds its second batch while ``gates/delay_windows`` exists
  (the test SIGKILLs it there); a retry holds its second batch while
  ``gates/delay_windows_retry`` exists (the test reads the checkpoint its first batch
  completed, before later checkpoints make retention discard it), then goes on.

A gate holds for at most HOLD_S (a hang guard, never reached when the test works).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from airflow_finalckpt.examples.nycflights13.branching import build_branching_dag

DAG_ID = "nycflights13_branching_e2e"
WORK = Path(os.environ.get("FINALCKPT_E2E_WORK", "/tmp/finalckpt-e2e-branching"))
DAYS = int(os.environ.get("FINALCKPT_E2E_DAYS", "21"))
#: Fixed batches: ingest writes three parts (7 days each), so enrich, delay_windows and
#: carrier_daily have three splits; delay_windows takes one per batch.
BATCH_SIZES = {
    "ingest": 7,
    "weather": 3,
    "enrich": 1,
    "delay_windows": 1,
    "carrier_daily": 1,
    "publish": 4,
}
HOLD_S = 900.0
#: Batches started by this process (a task try runs in its own process).
_batches = {"delay_windows": 0, "carrier_daily": 0}
#: Few shuffle partitions: the stages' data is small, and the machine running the suite busy.
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.showConsoleProgress": "false"}


def _hold(gate: str) -> None:
    deadline = time.monotonic() + HOLD_S
    while (WORK / "gates" / gate).exists() and time.monotonic() < deadline:
        time.sleep(0.5)


def _carrier_pace(_ctx: object) -> None:
    _batches["carrier_daily"] += 1
    if _batches["carrier_daily"] >= 3:  # the last of its three splits
        _hold("carrier_daily")


def _windows_pace(_ctx: object) -> None:
    from airflow.sdk import get_current_context

    _batches["delay_windows"] += 1
    if _batches["delay_windows"] >= 2:
        first = get_current_context()["ti"].try_number == 1
        _hold("delay_windows" if first else "delay_windows_retry")
    time.sleep(1.0)


dag = build_branching_dag(
    DAG_ID,
    input_dir=str(WORK / "input"),
    output_dir=str(WORK / "output"),
    sql_url=os.environ.get("FINALCKPT_EXAMPLE_SQL_URL"),
    days=DAYS,
    retries=2,
    batch_sizes=BATCH_SIZES,
    spark_conf=SPARK_CONF,
    batch_hooks={"delay_windows": _windows_pace, "carrier_daily": _carrier_pace},
    windows_asset=f"{DAG_ID}_delay_windows",
    carrier_asset=f"{DAG_ID}_carrier_daily",
)
