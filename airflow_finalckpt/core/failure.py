"""Why a checkpoint was aborted (Flink's CheckpointFailureReason): a closed set of causes, stored
next to the free-text detail so the CLI, REST and UI can group and filter aborts.
"""

from __future__ import annotations

from enum import StrEnum


class CheckpointFailureReason(StrEnum):
    """The cause of an aborted checkpoint; the detail text says the rest."""

    #: pending longer than the pipeline's checkpoint timeout
    EXPIRED = "expired"
    #: a stage declined to take part (``Coordinator.decline``)
    DECLINED = "declined"
    #: a newer checkpoint completed first (savepoints are never subsumed)
    SUBSUMED = "subsumed"
    #: writing the checkpoint's ``_metadata`` to checkpoint storage failed
    WRITE_FAILED = "write_failed"
    #: the pipeline was restored from a checkpoint or savepoint while it was pending
    RESTORED = "restored"
    #: aborted on request (``Coordinator.abort``: an operator, a test, a harness)
    MANUAL = "manual"


def expired(timeout_s: float) -> str:
    """Detail of an expired checkpoint (the text aborts carried before the enum existed)."""
    return f"timed out after {timeout_s:.0f} s"


def declined(stage_id: str, reason: str) -> str:
    """Detail of a declined checkpoint."""
    return f"declined by stage {stage_id!r}: {reason}"


def subsumed(checkpoint_id: int) -> str:
    """Detail of a subsumed checkpoint."""
    return f"subsumed by checkpoint {checkpoint_id}"


def write_failed(exc: BaseException) -> str:
    """Detail of a checkpoint whose metadata could not be written."""
    return f"writing checkpoint metadata failed: {exc}"


def restored(source: str) -> str:
    """Detail of a pending checkpoint a restore aborted."""
    return f"pipeline restored from {source}"


def savepoint_aborted(checkpoint_id: int, detail: str) -> str:
    """Why a stop with savepoint failed: its savepoint was aborted."""
    return f"savepoint {checkpoint_id} aborted: {detail}"
