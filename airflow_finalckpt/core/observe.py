"""What the checkpoint coordinator reports about its checkpoints, for metrics: a port that keeps
the core free of Airflow.

The coordinator calls ``notify`` with one of the events below after the transition that made it
true committed (never for a transition that rolled back). Nothing listens by default; the Airflow
side registers a listener (``airflow_finalckpt.metrics.install``) that sends the events to
Airflow's metrics (StatsD / OpenTelemetry). A listener must be cheap and must not raise: what it
raises is logged and dropped, a checkpoint never fails because of its metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointAcknowledged:
    """A stage acknowledged a pending checkpoint (at a batch boundary, explicitly or by its
    finish); ``lag_s``: from the checkpoint's trigger to this acknowledgement; ``last``: it was
    the acknowledgement the checkpoint still waited for.
    """

    pipeline_key: str
    checkpoint_id: int
    stage_id: str
    lag_s: float
    by_finish: bool
    last: bool


@dataclass(frozen=True)
class CheckpointCompleted:
    """A checkpoint or savepoint completed: ``duration_s`` from trigger to completion (its
    ``_metadata`` durably written), ``metadata_bytes`` the size of that file (None without
    checkpoint storage), ``state_bytes`` the state and staged output files it references.
    """

    pipeline_key: str
    checkpoint_id: int
    kind: str
    reason: str
    duration_s: float
    metadata_bytes: int | None
    state_bytes: int
    stages: int


@dataclass(frozen=True)
class CheckpointAborted:
    """A checkpoint was aborted; ``reason`` says why, in words (as logged and shown in the UI)."""

    pipeline_key: str
    checkpoint_id: int
    reason: str


CheckpointEvent = CheckpointAcknowledged | CheckpointCompleted | CheckpointAborted
Listener = Callable[[CheckpointEvent], None]

_listeners: list[Listener] = []


def add_listener(listener: Listener) -> Callable[[], None]:
    """Register ``listener`` (once, however often it is added); returns its remover."""
    if listener not in _listeners:
        _listeners.append(listener)

    def remove() -> None:
        if listener in _listeners:
            _listeners.remove(listener)

    return remove


def notify(event: CheckpointEvent) -> None:
    """Hand ``event`` to every listener; a failing listener is logged, never raised."""
    for listener in list(_listeners):
        try:
            listener(event)
        except Exception:
            log.debug("checkpoint listener %r failed on %r", listener, event, exc_info=True)
