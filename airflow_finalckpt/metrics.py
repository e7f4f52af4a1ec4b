"""Metrics through Airflow's own metrics pipeline (StatsD or OpenTelemetry, as ``[metrics]``
configures it), so they land on the dashboards the Airflow deployment already has.

Names (all prefixed ``finalckpt.``; tags ``stage_id``, and ``sink_id`` for commits):

- ``finalckpt.batch.duration`` (timer): one split batch, from processing to its record;
- ``finalckpt.batch.splits`` (gauge): splits in that batch;
- ``finalckpt.sink.commit.duration`` (timer): one sink transaction's commit;
- ``finalckpt.stage.finished`` / ``finalckpt.stage.closed`` (counters): a stage finished its
  input / closed on its final checkpoint.

Outside an Airflow process (a plain Spark driver, the fault harness, the benchmarks' plain runs)
nothing is emitted and Airflow is not imported; a failing metrics backend never fails the
pipeline.
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

BATCH_DURATION = "finalckpt.batch.duration"
BATCH_SPLITS = "finalckpt.batch.splits"
COMMIT_DURATION = "finalckpt.sink.commit.duration"
STAGE_FINISHED = "finalckpt.stage.finished"
STAGE_CLOSED = "finalckpt.stage.closed"


def _emit(kind: str, name: str, value: Any, tags: dict[str, str]) -> None:
    if "airflow.sdk" not in sys.modules:
        return  # not in an Airflow process: importing Airflow costs seconds and sets up logging
    try:
        from airflow.sdk.observability import stats
    except ImportError:
        return
    try:
        if kind == "timing":
            stats.timing(name, timedelta(seconds=value), tags=tags)
        elif kind == "gauge":
            stats.gauge(name, value, tags=tags)
        else:
            stats.incr(name, value, tags=tags)
    except Exception as exc:  # metrics are never worth a failed stage
        log.debug("metric %s not emitted: %s", name, exc)


def batch(stage_id: str, seconds: float, splits: int) -> None:
    _emit("timing", BATCH_DURATION, seconds, {"stage_id": stage_id})
    _emit("gauge", BATCH_SPLITS, splits, {"stage_id": stage_id})


def commit(stage_id: str, sink_id: str, seconds: float) -> None:
    _emit("timing", COMMIT_DURATION, seconds, {"stage_id": stage_id, "sink_id": sink_id})


def stage_finished(stage_id: str) -> None:
    _emit("incr", STAGE_FINISHED, 1, {"stage_id": stage_id})


def stage_closed(stage_id: str) -> None:
    _emit("incr", STAGE_CLOSED, 1, {"stage_id": stage_id})
