"""The run state of a pipeline run (what the UI, REST and CLI show) and when it stopped
working, as pure rules over its stages' lifecycles and its latest stop request.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum

from airflow_finalckpt.core.model import StageLifecycle, StopMode, StopState
from airflow_finalckpt.core.views import StopRequest


class PipelineRunState(StrEnum):
    """What a pipeline run is doing, as the UI shows it."""

    NOT_STARTED = "not_started"
    RUNNING = "running"
    #: a stop with savepoint was requested; the savepoint is in progress
    STOPPING = "stopping"
    SUSPENDED = "suspended"
    DRAINING = "draining"
    DRAINED = "drained"
    FINISHED = "finished"


def run_state(lifecycles: Collection[StageLifecycle], stop: StopRequest | None) -> PipelineRunState:
    """The run's state from its stages' lifecycles: a stop in progress or done wins.

    A run is *suspended* only once its savepoint completed **and** every stage that was running
    has parked (released Spark, lifecycle SUSPENDED); between the two it is still *stopping*.
    """
    if stop is not None and stop.state in (StopState.REQUESTED, StopState.COMPLETED):
        requested = stop.state is StopState.REQUESTED
        if stop.mode is StopMode.DRAIN:
            return PipelineRunState.DRAINING if requested else PipelineRunState.DRAINED
        if requested or StageLifecycle.RUNNING in lifecycles:
            return PipelineRunState.STOPPING
        return PipelineRunState.SUSPENDED
    if lifecycles and all(lc is StageLifecycle.CLOSED for lc in lifecycles):
        return PipelineRunState.FINISHED
    if all(lc is StageLifecycle.NOT_STARTED for lc in lifecycles):
        return PipelineRunState.NOT_STARTED
    return PipelineRunState.RUNNING


def ended_at(
    state: PipelineRunState, last_stage_change: float | None, stop: StopRequest | None
) -> float | None:
    """When the run stopped doing work: finished or drained at its last stage change,
    suspended when its savepoint completed; None while it runs (or has not started).
    """
    if state in (PipelineRunState.FINISHED, PipelineRunState.DRAINED):
        return last_stage_change
    if state is PipelineRunState.SUSPENDED and stop is not None:
        return stop.finished_at
    return None


def duration(started: float | None, ended: float | None, now: float) -> float | None:
    """Seconds from start to end (to ``now`` while it runs)."""
    if started is None:
        return None
    return max(0.0, (ended if ended is not None else now) - started)
