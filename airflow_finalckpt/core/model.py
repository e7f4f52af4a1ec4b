"""Value types shared by every part of the protocol core.

These are plain data (pydantic models and string enums): they cross process boundaries as JSON
(coordination store rows, XCom, checkpoint metadata), never as pickles.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer

#: Event time is an integer of milliseconds since the epoch. MAX_WATERMARK is Flink's
#: Long.MAX_VALUE: a stage that finishes with drain jumps its watermark there, firing every window.
MAX_WATERMARK = 2**63 - 1
MIN_WATERMARK = -(2**63)


class StageStatus(StrEnum):
    """A stage's status as recorded in a checkpoint (FLIP-147's operator finish status)."""

    FULLY_FINISHED = "FULLY_FINISHED"
    PARTIALLY_FINISHED = "PARTIALLY_FINISHED"
    RUNNING = "RUNNING"
    NOT_STARTED = "NOT_STARTED"


class StageLifecycle(StrEnum):
    """A stage's live state in the coordinator.

    FINISHED is FLIP-147's WAITING_FOR_FINAL_CP: finish() ran, end_of_data is published, the
    stage waits for a qualifying checkpoint. CLOSED means its transactions were committed.
    SUSPENDED is a stage stopped by a savepoint without finishing.
    """

    NOT_STARTED = "NOT_STARTED"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    SUSPENDED = "SUSPENDED"
    CLOSED = "CLOSED"

    @property
    def is_finished(self) -> bool:
        """True once finish() ran: the stage holds no further work."""
        return self in (StageLifecycle.FINISHED, StageLifecycle.CLOSED)


class CheckpointKind(StrEnum):
    """A periodic or eager checkpoint, a savepoint, or the savepoint a drain ends with."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"
    DRAINED_SAVEPOINT = "drained_savepoint"

    @property
    def is_savepoint(self) -> bool:
        """Savepoints (drained or not) are never subsumed and are kept by retention."""
        return self is not CheckpointKind.CHECKPOINT


class TriggerReason(StrEnum):
    """Why a checkpoint was triggered."""

    PERIODIC = "periodic"
    EAGER_FINAL = "eager_final"
    SAVEPOINT = "savepoint"
    DRAIN = "drain"
    MANUAL = "manual"


class CheckpointState(StrEnum):
    """A checkpoint's life in the coordination store."""

    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"
    DISCARDED = "DISCARDED"


class TransactionState(StrEnum):
    """A sink transaction's two-phase-commit state."""

    PRECOMMITTED = "PRECOMMITTED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


class StopMode(StrEnum):
    """Stop with drain (finish everything) or with savepoint (suspend, resume later)."""

    DRAIN = "drain"
    SAVEPOINT = "savepoint"


class StopState(StrEnum):
    """REQUESTED: in progress. COMPLETED: savepoint taken (suspended, or drained). FAILED: the
    savepoint was aborted and the run keeps running. RESUMED: a suspended run continued.
    """

    REQUESTED = "REQUESTED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    RESUMED = "RESUMED"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StateHandle(_Frozen):
    """A file of stage state or staged output, relative to the checkpoint storage root."""

    name: str
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


#: State handles whose name starts with this prefix list the stage's output parts.
OUTPUT_PREFIX = "output:"


def output_parts(handle: StateHandle) -> list[str]:
    """The parts an output handle names (``output:<part>[,<part>...]``); [] for other handles."""
    if not handle.name.startswith(OUTPUT_PREFIX):
        return []
    return [p for p in handle.name[len(OUTPUT_PREFIX) :].split(",") if p]


class SinkTransaction(_Frozen):
    """A sink transaction pre-committed at ``checkpoint_id`` (None: opened, not yet covered)."""

    sink_id: str
    txn_id: str
    checkpoint_id: int | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


class EndOfData(_Frozen):
    """What a finished stage tells its downstream stages (FLIP-147's EndOfData event)."""

    drain: bool = False
    manifest: list[str] = Field(default_factory=list)
    watermark: int = MAX_WATERMARK
    finished_at_checkpoint: int | None = None
    unread_splits: int = 0


class StageSnapshot(_Frozen):
    """What a stage acknowledges a checkpoint with (or finishes with)."""

    finished_splits: frozenset[str] = frozenset()
    state: tuple[StateHandle, ...] = ()
    pending_transactions: tuple[SinkTransaction, ...] = ()
    watermark: int | None = None
    end_of_data: EndOfData | None = None
    #: sha256 of the split list the stage declared (``core.split_list``); None: not known.
    split_list_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @field_serializer("finished_splits")
    def _sorted_splits(self, splits: frozenset[str]) -> list[str]:
        return sorted(splits)


class StageProgress(_Frozen):
    """The live view of a stage the plan calculator needs."""

    lifecycle: StageLifecycle
    finished_splits: frozenset[str] = frozenset()
    total_splits: int | None = None


class StageCheckpointRecord(_Frozen):
    """One stage inside a completed checkpoint.

    FULLY_FINISHED stages carry no state and (since metadata format version 2) no split ids,
    only the flag, their end_of_data (re-published on restore), the transactions they
    pre-committed but may not have committed yet, and ``finished_count``: how many splits
    they finished (None: not known; other statuses count their ``finished_splits``).
    """

    stage_id: str
    status: StageStatus
    finished_splits: frozenset[str] = frozenset()
    state: tuple[StateHandle, ...] = ()
    pending_transactions: tuple[SinkTransaction, ...] = ()
    watermark: int | None = None
    end_of_data: EndOfData | None = None
    finished_count: int | None = Field(default=None, ge=0)
    #: sha256 of the declared split list (RUNNING / PARTIALLY_FINISHED); None: not known.
    split_list_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @field_serializer("finished_splits")
    def _sorted_splits(self, splits: frozenset[str]) -> list[str]:
        return sorted(splits)

    @property
    def done_splits(self) -> int | None:
        """How many splits the stage finished (what views show); None: not known."""
        if self.finished_splits or self.status is not StageStatus.FULLY_FINISHED:
            return len(self.finished_splits)
        return self.finished_count


class FinishedStageEnd(_Frozen):
    """What a checkpoint records of a stage finished before it was triggered, read without
    its finished split ids: its end_of_data, final watermark and how many splits it finished
    (declared splits minus those a drain left unread; None: the stage declared none).
    """

    end_of_data: EndOfData | None = None
    watermark: int | None = None
    finished_count: int | None = Field(default=None, ge=0)


class CheckpointRecord(_Frozen):
    """The in-memory form of a completed checkpoint's ``_metadata``."""

    pipeline_key: str
    checkpoint_id: int = Field(ge=1)
    kind: CheckpointKind
    reason: TriggerReason
    graph: dict[str, Any]
    graph_fingerprint: str
    triggered_at: float
    completed_at: float
    stages: dict[str, StageCheckpointRecord]
