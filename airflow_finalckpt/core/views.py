"""The values the coordinator answers with and decides on: plain frozen data, no database.

``CheckpointInfo``, ``StageView`` and ``StopRequest`` are what the store's rows map to;
``StageRow`` is the narrower row the transitions read (its progress JSON parsed only on use);
``PipelineSnapshot`` is the read model waiting stages share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from functools import cached_property
from typing import Any

from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    EndOfData,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    StopMode,
    StopState,
    TriggerReason,
)
from airflow_finalckpt.core.plan import CheckpointPlan, attempts_gone
from airflow_finalckpt.core.restore import GraphChange, RestorePlan


class AckOutcome(StrEnum):
    """What an acknowledgement did."""

    ACCEPTED = "accepted"
    COMPLETED = "completed"
    DUPLICATE = "duplicate"
    NOT_PENDING = "not_pending"


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint as stored: kind, state, plan, counters, where its metadata is."""

    checkpoint_id: int
    kind: CheckpointKind
    reason: TriggerReason
    state: CheckpointState
    plan: CheckpointPlan
    acks_pending: int
    triggered_at: float
    completed_at: float | None
    failure_reason: str | None
    metadata_path: str | None
    size_bytes: int | None
    #: Why it was aborted (None: not aborted, or aborted before the cause was recorded).
    failure_kind: CheckpointFailureReason | None = None

    @property
    def is_completed(self) -> bool:
        """Completed, even if since discarded by retention."""
        return self.completed_at is not None


@dataclass(frozen=True)
class StageView:
    """A stage as the runtime, the triggers, the CLI and the UI see it."""

    stage_id: str
    lifecycle: StageLifecycle
    epoch: int
    total_splits: int | None
    progress: StageSnapshot
    finish_threshold: int | None
    final_snapshot: StageSnapshot | None
    closed_checkpoint_id: int | None

    def finished_count(self) -> int | None:
        """How many splits the stage finished: its finished split ids, or, for a finished
        stage restored from metadata v2 (which keeps no ids, only the count), its declared
        splits less those a drain left unread (None: not known).
        """
        if self.progress.finished_splits or not self.lifecycle.is_finished:
            return len(self.progress.finished_splits)
        if self.total_splits is None:
            return None
        final = self.final_snapshot
        eod = final.end_of_data if final is not None else None
        return max(0, self.total_splits - (eod.unread_splits if eod is not None else 0))


@dataclass(frozen=True)
class StopRequest:
    """A stop with drain or with savepoint, and how far it got."""

    request_id: int
    mode: StopMode
    state: StopState
    savepoint_id: int | None
    requested_by: str | None
    requested_at: float
    finished_at: float | None
    failure_reason: str | None


@dataclass(frozen=True)
class BatchOutcome:
    """What a stage learns at a split-batch boundary."""

    acked: tuple[int, ...]
    completed: tuple[int, ...]
    stop: StopRequest | None


@dataclass(frozen=True)
class FinishOutcome:
    """``threshold``: the first checkpoint id triggered after finish; the stage closes on a
    completed checkpoint >= it. ``eager_checkpoint_id``: the checkpoint finishing triggered,
    or the pending eager one it joined (``joined``: coalescing, nothing new was triggered).
    """

    threshold: int
    eager_checkpoint_id: int | None
    end_of_data: EndOfData
    joined: bool = False


@dataclass(frozen=True)
class CoordinatorOptions:
    """Per-pipeline settings stored with its graph."""

    retain_checkpoints: int = 3
    checkpoint_timeout_s: float = 600.0


@dataclass(frozen=True)
class StartOutcome:
    """What :meth:`Coordinator.start_pipeline` did: ``restored`` is the restore plan it applied
    (None: no ``restore_from``, or already restored from it), ``change`` the checked graph
    change of a continuation (None: the stored graph had the same fingerprint).
    """

    restored: RestorePlan | None = None
    change: GraphChange | None = None

    def describe(self) -> str | None:
        """One line for the task log, None when nothing happened worth a line."""
        if self.restored is not None:
            return self.restored.describe()
        if self.change is not None:
            return self.change.describe()
        return None


def suspends(stop: StopRequest | None) -> bool:
    """A stop with savepoint is in progress or completed (not resumed, not failed): no stage
    may start work or finish, and finished stages wait for the resume.
    """
    return (
        stop is not None
        and stop.mode is StopMode.SAVEPOINT
        and stop.state in (StopState.REQUESTED, StopState.COMPLETED)
    )


def draining(stop: StopRequest | None) -> bool:
    """A stop with drain is in progress: source stages stop taking splits."""
    return stop is not None and stop.mode is StopMode.DRAIN and stop.state is StopState.REQUESTED


def savepoint_in_progress(stop: StopRequest | None) -> bool:
    """A stop with savepoint waits for its savepoint: finished stages may not close meanwhile."""
    return (
        stop is not None and stop.mode is StopMode.SAVEPOINT and stop.state is StopState.REQUESTED
    )


def closable_on(
    lifecycle: StageLifecycle,
    closed_checkpoint_id: int | None,
    stop: StopRequest | None,
    first_completed_id: int | None,
) -> int | None:
    """The checkpoint a stage may close on: its own once CLOSED; for a FINISHED stage the lowest
    completed one >= its finish threshold (``first_completed_id``), unless a savepoint is in
    progress; None otherwise.
    """
    if lifecycle is StageLifecycle.CLOSED:
        return closed_checkpoint_id
    if lifecycle is not StageLifecycle.FINISHED or savepoint_in_progress(stop):
        return None
    return first_completed_id


def needs_final_checkpoint(
    lifecycle: StageLifecycle, stop: StopRequest | None, *, has_candidate: bool
) -> bool:
    """A FINISHED stage needs a new checkpoint when none in flight or done can close it
    (``has_candidate``: one >= its threshold is pending, completed or discarded) and no stop
    with savepoint makes it wait for that savepoint.
    """
    return lifecycle is StageLifecycle.FINISHED and not suspends(stop) and not has_candidate


def timed_out(pending: Iterable[tuple[int, float]], now: float, timeout_s: float) -> list[int]:
    """Pending checkpoints (id, triggered_at) older than the checkpoint timeout."""
    deadline = now - timeout_s
    return [cid for cid, triggered_at in pending if triggered_at < deadline]


def gone_among(
    leases: Mapping[str, tuple[StageLifecycle, int, float]], now: float
) -> tuple[str, ...]:
    """``core.plan.attempts_gone`` over ``StoreReader.awaited_leases``."""
    lifecycles = {sid: lease[0] for sid, lease in leases.items()}
    return attempts_gone(leases, lifecycles, {sid: lease[2] for sid, lease in leases.items()}, now)


@dataclass(frozen=True)
class WaitingStage:
    """One stage as its waiters see it (no progress JSON). ``first_completed_id``: the lowest
    completed checkpoint >= the finish threshold (what it may close on); ``first_candidate_id``:
    the lowest pending, completed or discarded one (a checkpoint in flight or done that can
    close it).
    """

    stage_id: str
    lifecycle: StageLifecycle
    epoch: int
    finish_threshold: int | None
    closed_checkpoint_id: int | None
    first_completed_id: int | None
    first_candidate_id: int | None


@dataclass(frozen=True)
class PipelineSnapshot:
    """What every waiting stage of a pipeline decides on, read at once (a few statements,
    however many stages wait): the read model the triggers share (``waiting_snapshot``).

    Its answers only say whether a waiter has *nothing to do*: anything else (an event to fire,
    a checkpoint to abort or trigger) is decided again by the coordinator itself, so a stale
    snapshot can delay a waiter by one read but never make it fire wrongly.
    """

    pipeline_key: str
    checkpoint_timeout_s: float
    stages: Mapping[str, WaitingStage]
    stop: StopRequest | None
    #: (checkpoint_id, triggered_at) of every pending checkpoint.
    pending: tuple[tuple[int, float], ...]
    #: Stage id -> (lifecycle, epoch, lease) of the stages with a lease a pending checkpoint
    #: waits for (``StoreReader.awaited_leases``).
    awaited_leases: Mapping[str, tuple[StageLifecycle, int, float]] = field(default_factory=dict)

    def gone_awaited(self, now: float) -> tuple[str, ...]:
        """Awaited stages whose attempt is gone: the coordinator answers for them."""
        return gone_among(self.awaited_leases, now)

    def timed_out(self, now: float) -> list[int]:
        """Pending checkpoints older than the checkpoint timeout (``expire_timed_out`` aborts
        them).
        """
        return timed_out(self.pending, now, self.checkpoint_timeout_s)

    def closable_checkpoint(self, stage_id: str) -> int | None:
        """As ``Coordinator.closable_checkpoint``; None also for a stage it does not know."""
        stage = self.stages.get(stage_id)
        if stage is None:
            return None
        return closable_on(
            stage.lifecycle, stage.closed_checkpoint_id, self.stop, stage.first_completed_id
        )

    def final_checkpoint_work(self, stage_id: str, now: float) -> bool:
        """As ``Coordinator._final_checkpoint_work(expire=True)``: would
        ``ensure_final_checkpoint`` change anything (a timed-out checkpoint to abort, or a
        finished stage without a candidate checkpoint and no savepoint to wait for)?
        """
        if self.timed_out(now) or self.gone_awaited(now):
            return True
        stage = self.stages.get(stage_id)
        if stage is None:
            return False
        has_candidate = stage.first_candidate_id is not None
        return needs_final_checkpoint(stage.lifecycle, self.stop, has_candidate=has_candidate)

    def final_checkpoint_idle(self, stage_id: str, epoch: int | None, now: float) -> bool:
        """A finished stage waiting for its final checkpoint has nothing to do: the attempt is
        current, the stage FINISHED, nothing to close on and no write work for
        ``ensure_final_checkpoint``.
        """
        stage = self.stages.get(stage_id)
        return (
            stage is not None
            and (epoch is None or stage.epoch == epoch)
            and stage.lifecycle is StageLifecycle.FINISHED
            and self.closable_checkpoint(stage_id) is None
            and not self.final_checkpoint_work(stage_id, now)
        )

    def resume_idle(self, stage_id: str, epoch: int | None) -> bool:
        """A suspended stage keeps waiting: the attempt is current and a stop with savepoint is
        still in progress or completed (not resumed, failed or a drain).
        """
        stage = self.stages.get(stage_id)
        return stage is not None and (epoch is None or stage.epoch == epoch) and suspends(self.stop)

    def closed_idle(self, stage_id: str) -> bool:
        """A stage someone waits to see CLOSED is known and not CLOSED yet."""
        stage = self.stages.get(stage_id)
        return stage is not None and stage.lifecycle is not StageLifecycle.CLOSED


def parse_snapshot(data: Mapping[str, Any] | None) -> StageSnapshot:
    """A snapshot from its stored JSON (an empty one for none)."""
    return StageSnapshot.model_validate(data or {})


@dataclass(frozen=True)
class StageRow:
    """A stage's stored row as the transitions read it; its JSON is parsed on first use (a
    fence check or a lifecycle test never pays for O(finished splits) of progress).
    """

    stage_id: str
    lifecycle: StageLifecycle
    epoch: int
    total_splits: int | None
    finish_threshold: int | None
    closed_checkpoint_id: int | None
    updated_at: float
    progress_data: Mapping[str, Any] | None = field(default=None, repr=False)
    final_data: Mapping[str, Any] | None = field(default=None, repr=False)
    #: The attempt lease (epoch seconds; None: no lease), see ``core.plan.attempt_gone``.
    lease_until: float | None = None

    @cached_property
    def progress(self) -> StageSnapshot:
        """The durable progress."""
        return parse_snapshot(self.progress_data)

    @cached_property
    def final_snapshot(self) -> StageSnapshot | None:
        """The snapshot the stage finished with (None before finish)."""
        return None if self.final_data is None else parse_snapshot(self.final_data)

    def view(self) -> StageView:
        """The public view of this row."""
        return StageView(
            stage_id=self.stage_id,
            lifecycle=self.lifecycle,
            epoch=self.epoch,
            total_splits=self.total_splits,
            progress=self.progress,
            finish_threshold=self.finish_threshold,
            final_snapshot=self.final_snapshot,
            closed_checkpoint_id=self.closed_checkpoint_id,
        )


class Keep(Enum):
    """Marks a nullable column a change leaves as it is."""

    KEEP = "keep"


KEEP = Keep.KEEP


@dataclass(frozen=True)
class StageChange:
    """The columns a transition writes to a stage row (None / KEEP: left as is)."""

    lifecycle: StageLifecycle | None = None
    epoch: int | None = None
    total_splits: int | None = None
    progress: StageSnapshot | None = None
    finish_threshold: int | Keep | None = KEEP
    final_snapshot: StageSnapshot | Keep | None = KEEP
    closed_checkpoint_id: int | Keep | None = KEEP


@dataclass(frozen=True)
class AckTarget:
    """What an acknowledgement decides on: the checkpoint's state and counters, whether it
    still waits for the stage (``due``) and whether the stage acknowledged it (``acked``).
    """

    state: CheckpointState
    acks_pending: int
    triggered_at: float
    due: bool
    acked: bool
    #: The newest checkpoint the stage acknowledged (any state), None if none.
    newest_acked: int | None = None


@dataclass(frozen=True)
class AckRow:
    """A stored acknowledgement: the snapshot a stage answered a checkpoint with."""

    stage_id: str
    by_finish: bool
    snapshot: StageSnapshot


@dataclass(frozen=True)
class TxnRow:
    """A stored sink transaction's state and covering checkpoint."""

    txn: SinkTransaction
    state: str
