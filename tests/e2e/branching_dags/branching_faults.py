"""Copies of the branching example pipeline for tests/e2e/test_branching_faults.py (a triggerer
SIGKILL while a finished branch waits deferred; stop with savepoint and with drain while both
branches run; one branch failing on every try while the other waits), each with its own output
under ``$FINALCKPT_E2E_WORK/<name>/output`` and paced by
gate files the test creates and removes, so what runs at the same time does not depend on the
machine's load.

A gate ``$FINALCKPT_E2E_WORK/gates/<dag_id>/<stage>-<n>`` holds the n-th batch (counted per
task try: one try runs in one process) of ``delay_windows`` or ``carrier_daily`` while the file
exists; on entering the hold the batch writes ``<stage>-<n>.held``, which the test waits for.
A gate holds for at most HOLD_S (a hang guard, never reached when the test works).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from airflow_finalckpt.examples.nycflights13.branching import build_branching_dag

WORK = Path(os.environ.get("FINALCKPT_E2E_WORK", "/tmp/finalckpt-e2e-branching-faults"))
DAYS = int(os.environ.get("FINALCKPT_E2E_DAYS", "21"))
#: Fixed batches: ingest writes three parts (7 days each), so enrich, delay_windows and
#: carrier_daily have three splits each and take one per batch.
BATCH_SIZES = {
    "ingest": 7,
    "weather": 3,
    "enrich": 1,
    "delay_windows": 1,
    "carrier_daily": 1,
    "publish": 4,
}
HOLD_S = 900.0
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.showConsoleProgress": "false"}
#: (dag_id, stage) -> batches started by this process
_batches: dict[tuple[str, str], int] = {}


def gate_dir(dag_id: str) -> Path:
    return WORK / "gates" / dag_id


def _pace(dag_id: str, stage: str) -> Callable[[object], None]:
    """A batch hook: batch n of ``stage`` waits while its gate file exists."""

    def pace(_ctx: object) -> None:
        n = _batches[(dag_id, stage)] = _batches.get((dag_id, stage), 0) + 1
        gate = gate_dir(dag_id) / f"{stage}-{n}"
        if gate.exists():
            gate.with_name(f"{gate.name}.held").touch()
            deadline = time.monotonic() + HOLD_S
            while gate.exists() and time.monotonic() < deadline:
                time.sleep(0.3)

    return pace


def _pace_or_fail(dag_id: str, stage: str) -> Callable[[object], None]:
    """``_pace``, then fail the batch while ``<stage>.fail`` exists in the DAG's gate
    directory: every try of the stage fails from then on (each try is a new process).
    """
    pace = _pace(dag_id, stage)

    def pace_or_fail(ctx: object) -> None:
        pace(ctx)
        if (gate_dir(dag_id) / f"{stage}.fail").exists():
            raise RuntimeError(f"injected failure of {stage} (test gate {stage}.fail)")

    return pace_or_fail


def _copy(
    dag_id: str,
    name: str,
    hook: Callable[[str, str], Callable[[object], None]] = _pace,
    *,
    paced: tuple[str, ...] = ("delay_windows", "carrier_daily"),
    sizes: dict[str, int] | None = None,
) -> object:
    return build_branching_dag(
        dag_id,
        input_dir=str(WORK / "input"),
        output_dir=str(WORK / name / "output"),
        days=DAYS,
        retries=1,
        batch_sizes={**BATCH_SIZES, **(sizes or {})},
        spark_conf=SPARK_CONF,
        batch_hooks={stage: hook(dag_id, stage) for stage in paced},
        windows_asset=f"{dag_id}_delay_windows",
        carrier_asset=f"{dag_id}_carrier_daily",
    )


# carrier_daily finishes and waits deferred for its final checkpoint; the triggerer is killed
triggerer_dag = _copy("branching_faults_triggerer", "triggerer")
# stop with savepoint while both branches run, then restore into a new DAG run
savepoint_dag = _copy("branching_faults_savepoint", "savepoint")
# stop with drain while both branches run
drain_dag = _copy("branching_faults_drain", "drain")
# one branch fails on every try while the other finished and waits for its final checkpoint
fail_windows_dag = _copy("branching_faults_fail_windows", "fail_windows", _pace_or_fail)
fail_carrier_dag = _copy("branching_faults_fail_carrier", "fail_carrier", _pace_or_fail)
# stop with drain while both sources run: weather (one origin per batch) is a dimension
drain_sources_dag = _copy(
    "branching_faults_drain_sources",
    "drain_sources",
    paced=("ingest", "weather"),
    sizes={"weather": 1},
)
# a continuation DAG run on the same pipeline key while the first one still runs
two_runs_dag = _copy("branching_faults_two_runs", "two_runs")
