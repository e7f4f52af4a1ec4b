"""The stop-and-resume rules of the coordinator as pure functions over plain values: who may
request a stop, which savepoint it triggers, what a finishing stage triggers meanwhile, when a
suspended run may resume.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_finalckpt.core.errors import DrainedSavepointError, StopRequestError
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    StageLifecycle,
    StopMode,
    StopState,
    TriggerReason,
)
from airflow_finalckpt.core.views import StopRequest, draining, suspends


def check_stop_request(
    pipeline_key: str, stop: StopRequest | None, lifecycles: Iterable[StageLifecycle]
) -> None:
    """A stop is refused while another runs, after a drain or at a savepoint not resumed, and
    once every stage closed.
    """
    if stop is not None and stop.state is StopState.REQUESTED:
        raise StopRequestError(
            f"pipeline {pipeline_key!r} is already stopping ({stop.mode} requested)"
        )
    if stop is not None and stop.state is StopState.COMPLETED:
        if stop.mode is StopMode.DRAIN:
            raise StopRequestError(f"pipeline {pipeline_key!r} was already drained")
        raise StopRequestError(
            f"pipeline {pipeline_key!r} is suspended at savepoint {stop.savepoint_id}; "
            "resume it first"
        )
    states = list(lifecycles)
    if states and all(s is StageLifecycle.CLOSED for s in states):
        raise StopRequestError(f"pipeline {pipeline_key!r} has already finished: nothing to stop")


def stop_savepoint(mode: StopMode, lifecycles: Iterable[StageLifecycle]) -> CheckpointKind | None:
    """The savepoint a new stop triggers at once: a savepoint for a stop with savepoint, the
    drained savepoint for a drain whose stages all finished already (else it comes with the
    last finish).
    """
    if mode is StopMode.SAVEPOINT:
        return CheckpointKind.SAVEPOINT
    if all(s.is_finished for s in lifecycles):
        return CheckpointKind.DRAINED_SAVEPOINT
    return None


def savepoint_reason(kind: CheckpointKind) -> TriggerReason:
    """The trigger reason of a stop's savepoint."""
    return (
        TriggerReason.DRAIN if kind is CheckpointKind.DRAINED_SAVEPOINT else TriggerReason.SAVEPOINT
    )


def completed_at_once(state: CheckpointState | None) -> bool:
    """The stop's savepoint completed within its own trigger (nothing to acknowledge)."""
    return state is CheckpointState.COMPLETED


def eager_kind(
    stop: StopRequest | None, lifecycles: Iterable[StageLifecycle]
) -> CheckpointKind | None:
    """What a finishing stage (or a waiter replacing an aborted final checkpoint) triggers:
    nothing while suspended (it waits for that exact savepoint), the drained savepoint once a
    drain finished every stage, else an eager final checkpoint. ``lifecycles`` is read only
    while draining.
    """
    if suspends(stop):
        return None
    if draining(stop) and all(s.is_finished for s in lifecycles):
        return CheckpointKind.DRAINED_SAVEPOINT
    return CheckpointKind.CHECKPOINT


def check_resume(pipeline_key: str, stop: StopRequest | None) -> StopRequest:
    """Only a run suspended at a completed savepoint resumes: not a drain, not a savepoint in
    progress, not a run never stopped (or already resumed, or whose stop failed).
    """
    if stop is None or stop.state in (StopState.FAILED, StopState.RESUMED):
        raise StopRequestError(f"pipeline {pipeline_key!r} is not suspended")
    if stop.mode is StopMode.DRAIN:
        if stop.state is StopState.COMPLETED:
            raise DrainedSavepointError(
                f"pipeline {pipeline_key!r} was drained at savepoint {stop.savepoint_id}: its "
                "windows already fired, it cannot be resumed"
            )
        raise StopRequestError(f"pipeline {pipeline_key!r} is draining")
    if stop.state is StopState.REQUESTED:
        raise StopRequestError(
            f"pipeline {pipeline_key!r}: savepoint {stop.savepoint_id} is still in progress; "
            "resume after it completed"
        )
    return stop


def resume_needs_checkpoint(lifecycles: Iterable[StageLifecycle]) -> bool:
    """Stages that finished during the stop waited for the savepoint: give them a checkpoint to
    close on now.
    """
    return any(s is StageLifecycle.FINISHED for s in lifecycles)
