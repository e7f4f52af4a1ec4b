"""The stage rules of the coordinator as pure functions over plain values: fencing, a new
attempt's lifecycle, recording a batch, finishing, closing, committing, resetting, restoring.
Each takes the rows the store read and returns the change to write (or raises the refusal).
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_finalckpt.core.errors import IllegalTransitionError, StaleEpochError
from airflow_finalckpt.core.model import (
    EndOfData,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    TransactionState,
)
from airflow_finalckpt.core.restore import StageAction, StageRestore
from airflow_finalckpt.core.transitions import merge_progress
from airflow_finalckpt.core.views import (
    FinishOutcome,
    StageChange,
    StageRow,
    StopRequest,
    TxnRow,
    savepoint_in_progress,
    suspends,
)


def fence(row: StageRow, epoch: int) -> None:
    """StaleEpochError unless ``epoch`` is the stage's current attempt."""
    if row.epoch != epoch:
        raise StaleEpochError(row.stage_id, epoch, row.epoch)


def starts_work(lifecycle: StageLifecycle) -> bool:
    """A new attempt of a NOT_STARTED or SUSPENDED stage starts work (RUNNING or SUSPENDED);
    one of a RUNNING or finished stage keeps its lifecycle.
    """
    return lifecycle in (StageLifecycle.NOT_STARTED, StageLifecycle.SUSPENDED)


def attempt_lifecycle(lifecycle: StageLifecycle, *, suspended: bool) -> StageLifecycle:
    """A new attempt's lifecycle: a finished stage stays finished; while a stop with savepoint
    is in progress or done (``suspended``: and no pending checkpoint awaits the stage) a stage
    that has not started work begins SUSPENDED, else RUNNING.
    """
    if not starts_work(lifecycle):
        return lifecycle
    return StageLifecycle.SUSPENDED if suspended else StageLifecycle.RUNNING


def start_attempt(
    row: StageRow,
    *,
    suspended: bool,
    total_splits: int | None,
    split_list_sha256: str | None = None,
) -> StageChange:
    """A new attempt: the next epoch (older attempts are fenced) and its lifecycle; the
    fingerprint of the split list it declared joins its progress (checkpoints record it).
    """
    progress = None
    if split_list_sha256 is not None and split_list_sha256 != row.progress.split_list_sha256:
        progress = row.progress.model_copy(update={"split_list_sha256": split_list_sha256})
    return StageChange(
        lifecycle=attempt_lifecycle(row.lifecycle, suspended=suspended),
        epoch=row.epoch + 1,
        total_splits=total_splits,
        progress=progress,
    )


def record_batch(row: StageRow, delta: StageSnapshot, *, replace_state: bool) -> StageChange:
    """A split batch made durable; only a RUNNING stage records progress."""
    if row.lifecycle is not StageLifecycle.RUNNING:
        raise IllegalTransitionError(
            f"stage {row.stage_id!r} is {row.lifecycle}, not RUNNING: it cannot record "
            "split progress"
        )
    return StageChange(progress=merge_progress(row.progress, delta, replace_state=replace_state))


def already_finished(row: StageRow) -> FinishOutcome | None:
    """finish() is idempotent: a finished stage answers with its recorded outcome; a stage
    that is not RUNNING cannot finish; None: finish it now.
    """
    if row.lifecycle.is_finished:
        final = row.final_snapshot
        assert final is not None and final.end_of_data is not None
        assert row.finish_threshold is not None
        return FinishOutcome(int(row.finish_threshold), None, final.end_of_data)
    if row.lifecycle is not StageLifecycle.RUNNING:
        raise IllegalTransitionError(
            f"stage {row.stage_id!r} is {row.lifecycle}, it cannot finish (start an attempt first)"
        )
    return None


def finish(row: StageRow, snapshot: StageSnapshot, threshold: int) -> tuple[StageChange, EndOfData]:
    """FINISHED with its final snapshot; ``threshold`` (the next checkpoint id) is the first
    checkpoint it may close on, carried in its end_of_data.
    """
    eod = (snapshot.end_of_data or EndOfData()).model_copy(
        update={"finished_at_checkpoint": threshold}
    )
    merged = merge_progress(row.progress, snapshot, replace_state=True)
    final = merged.model_copy(update={"end_of_data": eod, "pending_transactions": ()})
    change = StageChange(
        lifecycle=StageLifecycle.FINISHED,
        finish_threshold=threshold,
        final_snapshot=final,
        progress=final,
    )
    return change, eod


def committable(
    uncommitted: Sequence[SinkTransaction], latest_completed: int | None
) -> list[SinkTransaction]:
    """Pre-committed transactions covered by a completed checkpoint."""
    if latest_completed is None:
        return []
    return [
        txn
        for txn in uncommitted
        if txn.checkpoint_id is not None and txn.checkpoint_id <= latest_completed
    ]


def may_commit(txn: TxnRow, latest_completed: int | None) -> bool:
    """False if already committed; refused if aborted or not covered by a completed checkpoint
    (committing it could duplicate data after a restore).
    """
    sink_id, txn_id, covered = txn.txn.sink_id, txn.txn.txn_id, txn.txn.checkpoint_id
    if txn.state == TransactionState.COMMITTED.value:
        return False
    if txn.state == TransactionState.ABORTED.value:
        raise IllegalTransitionError(
            f"transaction {txn_id!r} of sink {sink_id!r} was aborted; it cannot commit"
        )
    if covered is None or latest_completed is None or covered > latest_completed:
        raise IllegalTransitionError(
            f"transaction {txn_id!r} of sink {sink_id!r} is not covered by a completed "
            "checkpoint yet; committing it now could duplicate data after a restore"
        )
    return True


def close_gate(row: StageRow, stop: StopRequest | None) -> bool:
    """False: already CLOSED (nothing to do); refused unless FINISHED and no savepoint is in
    progress (the stage waits for that savepoint).
    """
    if row.lifecycle is StageLifecycle.CLOSED:
        return False
    if row.lifecycle is not StageLifecycle.FINISHED:
        raise IllegalTransitionError(
            f"stage {row.stage_id!r} is {row.lifecycle}; only a finished stage can close"
        )
    if savepoint_in_progress(stop):
        assert stop is not None
        raise IllegalTransitionError(
            f"stage {row.stage_id!r} cannot close while savepoint {stop.savepoint_id} is in "
            "progress: it waits for that savepoint"
        )
    return True


def close(
    row: StageRow,
    checkpoint_id: int,
    completed: bool,
    uncommitted: Sequence[SinkTransaction],
) -> StageChange:
    """CLOSED on a completed checkpoint >= its finish threshold once every transaction it
    covers is committed; the remaining (later) ones are the caller's to abort.
    """
    if not completed or checkpoint_id < int(row.finish_threshold or 0):
        raise IllegalTransitionError(
            f"stage {row.stage_id!r} cannot close on checkpoint {checkpoint_id}: it needs a "
            f"completed checkpoint >= {row.finish_threshold} (its first checkpoint after finish)"
        )
    blocking = [
        x for x in uncommitted if x.checkpoint_id is not None and x.checkpoint_id <= checkpoint_id
    ]
    if blocking:
        raise IllegalTransitionError(
            f"stage {row.stage_id!r} cannot close: transactions "
            f"{sorted(x.txn_id for x in blocking)} are covered by checkpoint "
            f"{checkpoint_id} but not committed yet"
        )
    return StageChange(lifecycle=StageLifecycle.CLOSED, closed_checkpoint_id=checkpoint_id)


def reset(row: StageRow) -> StageChange:
    """Forget a stage's progress (it recomputes); the new epoch fences a running attempt."""
    return StageChange(
        lifecycle=StageLifecycle.NOT_STARTED,
        epoch=row.epoch + 1,
        progress=StageSnapshot(),
        finish_threshold=None,
        final_snapshot=None,
        closed_checkpoint_id=None,
    )


def suspend(row: StageRow, stop: StopRequest | None) -> StageChange | None:
    """A running stage stops at a batch boundary for a savepoint (refused without one in
    progress); None: nothing to write (not RUNNING).
    """
    if not suspends(stop):
        raise IllegalTransitionError(
            f"stage {row.stage_id!r} cannot suspend: no stop-with-savepoint is in progress"
        )
    if row.lifecycle is StageLifecycle.RUNNING:
        return StageChange(lifecycle=StageLifecycle.SUSPENDED)
    return None


def restore_aborts(
    decision: StageRestore, uncommitted: Sequence[SinkTransaction]
) -> list[SinkTransaction]:
    """Uncommitted transactions the restored checkpoint does not hold: they are aborted."""
    kept = {(x.sink_id, x.txn_id) for x in decision.pending_transactions}
    return [txn for txn in uncommitted if (txn.sink_id, txn.txn_id) not in kept]


def restore(row: StageRow, decision: StageRestore, checkpoint_id: int) -> StageChange:
    """A stage reset to a checkpoint: fully finished ones FINISHED and closable at once on
    it, the others NOT_STARTED with their finished splits and state.
    """
    skip = decision.action is StageAction.SKIP
    snapshot = StageSnapshot(
        finished_splits=decision.finished_splits,
        state=decision.state,
        watermark=decision.watermark,
        end_of_data=decision.end_of_data if skip else None,
        split_list_sha256=decision.split_list_sha256,
    )
    if skip:
        eod = decision.end_of_data
        total = None
        if decision.finished_count is not None:  # metadata v2 keeps the count, not the ids
            total = decision.finished_count + (eod.unread_splits if eod is not None else 0)
        return StageChange(
            lifecycle=StageLifecycle.FINISHED,
            epoch=row.epoch + 1,
            total_splits=total,
            progress=snapshot,
            finish_threshold=checkpoint_id,
            final_snapshot=snapshot.model_copy(update={"state": ()}),
            closed_checkpoint_id=None,
        )
    return StageChange(
        lifecycle=StageLifecycle.NOT_STARTED,
        epoch=row.epoch + 1,
        progress=snapshot,
        finish_threshold=None,
        final_snapshot=None,
        closed_checkpoint_id=None,
    )
