"""Metrics through Airflow's own metrics pipeline (StatsD or OpenTelemetry, as ``[metrics]``
configures it), so they land on the dashboards the Airflow deployment already has.

Names (all prefixed ``finalckpt.``; tags ``stage_id``, and ``sink_id`` for commits):

- ``finalckpt.batch.duration`` (timer): one split batch, from processing to its record;
- ``finalckpt.batch.splits`` (gauge): splits in that batch;
- ``finalckpt.sink.commit.duration`` (timer): one sink transaction's commit;
- ``finalckpt.stage.finished`` / ``finalckpt.stage.closed`` (counters): a stage finished its
  input / closed on its final checkpoint;
- ``finalckpt.checkpoint.duration`` (timer, tag ``kind``): a checkpoint or savepoint, from its
  trigger to its completion (``_metadata`` durably written);
- ``finalckpt.checkpoint.size`` (gauge, tag ``kind``): bytes of the completed checkpoint's
  ``_metadata`` file;
- ``finalckpt.checkpoint.state_size`` (gauge, tag ``kind``): bytes of the state and staged output
  files the completed checkpoint references;
- ``finalckpt.checkpoint.ack_lag`` (timer, tag ``stage_id``): from a checkpoint's trigger to that
  stage's acknowledgement (batch boundary, explicit, or its finish);
- ``finalckpt.checkpoint.last_ack_lag`` (timer, tag ``stage_id``: the stage that acknowledged
  last): from the trigger to the last acknowledgement the checkpoint waited for;
- ``finalckpt.checkpoint.aborted`` (counter): a pending checkpoint aborted (declined, timed out,
  subsumed, metadata write failed).

The checkpoint metrics come from the coordinator, which stays free of Airflow: it reports through
the ``airflow_finalckpt.core.observe`` port, and ``install()`` (called when the Airflow hook
module is imported, i.e. in every worker and triggerer that runs stages) connects that port to
the functions here.

Outside an Airflow process (a plain Spark driver, the fault harness, the benchmarks' plain runs)
nothing is emitted and Airflow is not imported; a failing metrics backend never fails the
pipeline.
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_finalckpt.core.observe import CheckpointEvent

log = logging.getLogger(__name__)

BATCH_DURATION = "finalckpt.batch.duration"
BATCH_SPLITS = "finalckpt.batch.splits"
COMMIT_DURATION = "finalckpt.sink.commit.duration"
STAGE_FINISHED = "finalckpt.stage.finished"
STAGE_CLOSED = "finalckpt.stage.closed"
CHECKPOINT_DURATION = "finalckpt.checkpoint.duration"
CHECKPOINT_SIZE = "finalckpt.checkpoint.size"
CHECKPOINT_STATE_SIZE = "finalckpt.checkpoint.state_size"
CHECKPOINT_ACK_LAG = "finalckpt.checkpoint.ack_lag"
CHECKPOINT_LAST_ACK_LAG = "finalckpt.checkpoint.last_ack_lag"
CHECKPOINT_ABORTED = "finalckpt.checkpoint.aborted"


_configured = False


def _configure_stats() -> None:
    """Configure the Task SDK's stats from ``[metrics]`` where no Airflow code did: the task
    runner does before a task runs, but the triggerer's trigger-runner process (where the
    final-checkpoint trigger may complete checkpoints) and ``dag.test()`` do not, and their
    metrics would silently go nowhere. A backend set up by Airflow (or a test) is kept.
    """
    global _configured
    if _configured:
        return
    _configured = True
    try:
        from airflow.sdk._shared.observability.metrics import stats as shared
        from airflow.sdk.configuration import conf
        from airflow.sdk.observability.metrics import stats_utils

        if getattr(shared, "_factory", None) is None:
            shared.initialize(
                factory=stats_utils.get_stats_factory(),
                export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True),
            )
    except Exception as exc:  # another Airflow layout: leave the stats as they are
        log.debug("Airflow stats not configured by finalckpt: %s", exc)


def _emit(kind: str, name: str, value: Any, tags: dict[str, str]) -> None:
    if "airflow.sdk" not in sys.modules:
        return  # not in an Airflow process: importing Airflow costs seconds and sets up logging
    try:
        from airflow.sdk.observability import stats
    except ImportError:
        return
    _configure_stats()
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
    """One batch of a stage: how long it took and how many splits it read."""
    _emit("timing", BATCH_DURATION, seconds, {"stage_id": stage_id})
    _emit("gauge", BATCH_SPLITS, splits, {"stage_id": stage_id})


def commit(stage_id: str, sink_id: str, seconds: float) -> None:
    """How long one sink's commit took for a stage."""
    _emit("timing", COMMIT_DURATION, seconds, {"stage_id": stage_id, "sink_id": sink_id})


def stage_finished(stage_id: str) -> None:
    """Count a stage reaching end of input (FINISHED)."""
    _emit("incr", STAGE_FINISHED, 1, {"stage_id": stage_id})


def stage_closed(stage_id: str) -> None:
    """Count a stage closing after its final checkpoint committed (CLOSED)."""
    _emit("incr", STAGE_CLOSED, 1, {"stage_id": stage_id})


def checkpoint_event(event: CheckpointEvent) -> None:
    """The coordinator's checkpoint events (``core.observe``) as metrics."""
    from airflow_finalckpt.core.observe import (
        CheckpointAborted,
        CheckpointAcknowledged,
        CheckpointCompleted,
    )

    if isinstance(event, CheckpointCompleted):
        kind = {"kind": event.kind}
        _emit("timing", CHECKPOINT_DURATION, event.duration_s, kind)
        if event.metadata_bytes is not None:
            _emit("gauge", CHECKPOINT_SIZE, event.metadata_bytes, kind)
        _emit("gauge", CHECKPOINT_STATE_SIZE, event.state_bytes, kind)
    elif isinstance(event, CheckpointAcknowledged):
        stage = {"stage_id": event.stage_id}
        _emit("timing", CHECKPOINT_ACK_LAG, event.lag_s, stage)
        if event.last:
            _emit("timing", CHECKPOINT_LAST_ACK_LAG, event.lag_s, stage)
    elif isinstance(event, CheckpointAborted):
        _emit("incr", CHECKPOINT_ABORTED, 1, {})


def install() -> None:
    """Send the coordinator's checkpoint events to Airflow's metrics (idempotent)."""
    from airflow_finalckpt.core.observe import add_listener

    add_listener(checkpoint_event)
