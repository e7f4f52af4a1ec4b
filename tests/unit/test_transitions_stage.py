"""The coordinator's stage and stop rules on plain values, no database: fencing, attempts,
batches, finish, close, commit, reset, restore, suspend, stop and resume."""

from __future__ import annotations

import pytest

from airflow_finalckpt.core import transitions_stage as stage
from airflow_finalckpt.core import transitions_stop as stops
from airflow_finalckpt.core.errors import (
    DrainedSavepointError,
    IllegalTransitionError,
    StaleEpochError,
    StopRequestError,
)
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    EndOfData,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    StopMode,
    StopState,
    TransactionState,
    TriggerReason,
)
from airflow_finalckpt.core.restore import StageAction, StageRestore
from airflow_finalckpt.core.views import KEEP, StageRow, StopRequest, TxnRow

L = StageLifecycle


def row(
    lifecycle: StageLifecycle = L.RUNNING,
    *,
    epoch: int = 3,
    threshold: int | None = None,
    final: StageSnapshot | None = None,
    splits: tuple[str, ...] = (),
) -> StageRow:
    return StageRow(
        stage_id="s",
        lifecycle=lifecycle,
        epoch=epoch,
        total_splits=None,
        finish_threshold=threshold,
        closed_checkpoint_id=None,
        updated_at=0.0,
        progress_data=StageSnapshot(finished_splits=frozenset(splits)).model_dump(mode="json"),
        final_data=None if final is None else final.model_dump(mode="json"),
    )


def stop(
    mode: StopMode = StopMode.SAVEPOINT,
    state: StopState = StopState.REQUESTED,
    savepoint_id: int | None = 7,
) -> StopRequest:
    return StopRequest(1, mode, state, savepoint_id, "me", 0.0, None, None)


def txn(txn_id: str, checkpoint_id: int | None) -> SinkTransaction:
    return SinkTransaction(sink_id="k", txn_id=txn_id, checkpoint_id=checkpoint_id)


# ---------------------------------------------------------------------------------- attempts


def test_fence() -> None:
    stage.fence(row(epoch=3), 3)
    with pytest.raises(StaleEpochError):
        stage.fence(row(epoch=3), 2)


@pytest.mark.parametrize(
    ("lifecycle", "suspended", "expected"),
    [
        (L.NOT_STARTED, False, L.RUNNING),
        (L.SUSPENDED, False, L.RUNNING),
        (L.SUSPENDED, True, L.SUSPENDED),  # a retry during the stop stays suspended
        (L.NOT_STARTED, True, L.SUSPENDED),  # a savepoint stop is in progress or done
        (L.RUNNING, True, L.RUNNING),
        (L.FINISHED, False, L.FINISHED),  # a finished stage stays finished
        (L.CLOSED, True, L.CLOSED),
    ],
)
def test_attempt_lifecycle(lifecycle: L, suspended: bool, expected: L) -> None:
    change = stage.start_attempt(row(lifecycle, epoch=3), suspended=suspended, total_splits=9)
    assert (change.lifecycle, change.epoch, change.total_splits) == (expected, 4, 9)
    assert stage.start_attempt(row(), suspended=False, total_splits=None).total_splits is None


def test_record_batch_only_while_running() -> None:
    change = stage.record_batch(
        row(splits=("a",)), StageSnapshot(finished_splits=frozenset({"b"})), replace_state=False
    )
    assert change.progress is not None and change.progress.finished_splits == {"a", "b"}
    assert change.lifecycle is None and change.finish_threshold is KEEP
    with pytest.raises(IllegalTransitionError, match="not RUNNING"):
        stage.record_batch(row(L.SUSPENDED), StageSnapshot(), replace_state=True)


# ---------------------------------------------------------------------------------- finish


def test_finish_sets_threshold_and_end_of_data() -> None:
    snapshot = StageSnapshot(
        finished_splits=frozenset({"b"}),
        pending_transactions=(txn("t", None),),
        end_of_data=EndOfData(drain=True, manifest=["m"]),
    )
    assert stage.already_finished(row()) is None
    change, eod = stage.finish(row(splits=("a",)), snapshot, threshold=5)
    assert eod.finished_at_checkpoint == 5 and eod.drain and eod.manifest == ["m"]
    assert change.lifecycle is L.FINISHED and change.finish_threshold == 5
    final = change.final_snapshot
    assert isinstance(final, StageSnapshot)
    assert final == change.progress
    assert final.finished_splits == {"a", "b"} and final.pending_transactions == ()
    assert final.end_of_data == eod


def test_finish_is_idempotent_and_needs_a_running_attempt() -> None:
    eod = EndOfData(finished_at_checkpoint=4)
    done = stage.already_finished(
        row(L.FINISHED, threshold=4, final=StageSnapshot(end_of_data=eod))
    )
    assert done is not None and (done.threshold, done.eager_checkpoint_id) == (4, None)
    assert done.end_of_data == eod
    for lifecycle in (L.NOT_STARTED, L.SUSPENDED):
        with pytest.raises(IllegalTransitionError, match="cannot finish"):
            stage.already_finished(row(lifecycle))


# ---------------------------------------------------------------------------------- close


def test_close_gate() -> None:
    assert stage.close_gate(row(L.CLOSED), None) is False
    assert stage.close_gate(row(L.FINISHED, threshold=2), stop(state=StopState.COMPLETED))
    with pytest.raises(IllegalTransitionError, match="only a finished stage can close"):
        stage.close_gate(row(L.RUNNING), None)
    with pytest.raises(IllegalTransitionError, match="savepoint 7 is in progress"):
        stage.close_gate(row(L.FINISHED, threshold=2), stop())


def test_close_needs_a_completed_checkpoint_at_or_after_the_threshold() -> None:
    finished = row(L.FINISHED, threshold=4)
    change = stage.close(finished, 4, True, [txn("later", 5), txn("uncovered", None)])
    assert change.lifecycle is L.CLOSED and change.closed_checkpoint_id == 4
    with pytest.raises(IllegalTransitionError, match="completed checkpoint >= 4"):
        stage.close(finished, 3, True, [])
    with pytest.raises(IllegalTransitionError, match="completed checkpoint >= 4"):
        stage.close(finished, 4, False, [])
    with pytest.raises(IllegalTransitionError, match=r"\['covered'\].*not committed yet"):
        stage.close(finished, 4, True, [txn("covered", 4)])


def test_commit_rules() -> None:
    assert stage.may_commit(TxnRow(txn("t", 2), TransactionState.PRECOMMITTED.value), 2)
    assert not stage.may_commit(TxnRow(txn("t", 2), TransactionState.COMMITTED.value), 2)
    with pytest.raises(IllegalTransitionError, match="was aborted"):
        stage.may_commit(TxnRow(txn("t", 2), TransactionState.ABORTED.value), 2)
    for covered, latest in ((None, 2), (3, 2), (2, None)):
        with pytest.raises(IllegalTransitionError, match="not covered by a completed"):
            stage.may_commit(TxnRow(txn("t", covered), TransactionState.PRECOMMITTED.value), latest)


def test_committable() -> None:
    txns = [txn("a", 1), txn("b", 3), txn("c", None)]
    assert [x.txn_id for x in stage.committable(txns, 2)] == ["a"]
    assert stage.committable(txns, None) == []


def test_reset_forgets_everything_and_fences() -> None:
    change = stage.reset(row(L.CLOSED, epoch=5))
    assert (change.lifecycle, change.epoch, change.progress) == (L.NOT_STARTED, 6, StageSnapshot())
    assert change.finish_threshold is None and change.final_snapshot is None
    assert change.closed_checkpoint_id is None


def test_restore_finished_stages_closable_at_once_others_fresh() -> None:
    kept = txn("kept", 3)
    eod = EndOfData(manifest=["m"])
    skip = StageRestore(
        stage_id="s",
        action=StageAction.SKIP,
        finished_splits=frozenset({"a"}),
        pending_transactions=(kept,),
        end_of_data=eod,
    )
    change = stage.restore(row(L.RUNNING, epoch=2), skip, 3)
    assert (change.lifecycle, change.epoch, change.finish_threshold) == (L.FINISHED, 3, 3)
    assert change.progress is not None and change.progress.end_of_data == eod
    assert change.closed_checkpoint_id is None
    assert stage.restore_aborts(skip, [kept, txn("dropped", None)]) == [txn("dropped", None)]
    rerun = StageRestore(stage_id="s", action=StageAction.RESUME, finished_splits=frozenset({"a"}))
    change = stage.restore(row(L.FINISHED, epoch=2), rerun, 3)
    assert change.lifecycle is L.NOT_STARTED and change.finish_threshold is None
    assert change.progress is not None and change.progress.end_of_data is None


def test_suspend() -> None:
    change = stage.suspend(row(L.RUNNING), stop())
    assert change is not None and change.lifecycle is L.SUSPENDED
    assert stage.suspend(row(L.FINISHED), stop()) is None
    for no_savepoint in (None, stop(StopMode.DRAIN), stop(state=StopState.FAILED)):
        with pytest.raises(IllegalTransitionError, match="no stop-with-savepoint"):
            stage.suspend(row(), no_savepoint)


# ---------------------------------------------------------------------------------- stop


def test_stop_requests_refused() -> None:
    running = [L.RUNNING, L.CLOSED]
    stops.check_stop_request("p", None, running)
    stops.check_stop_request("p", stop(state=StopState.RESUMED), running)
    stops.check_stop_request("p", stop(state=StopState.FAILED), running)
    with pytest.raises(StopRequestError, match="already stopping"):
        stops.check_stop_request("p", stop(), running)
    with pytest.raises(StopRequestError, match="already drained"):
        stops.check_stop_request("p", stop(StopMode.DRAIN, StopState.COMPLETED), running)
    with pytest.raises(StopRequestError, match="suspended at savepoint 7"):
        stops.check_stop_request("p", stop(state=StopState.COMPLETED), running)
    with pytest.raises(StopRequestError, match="already finished"):
        stops.check_stop_request("p", None, [L.CLOSED, L.CLOSED])
    stops.check_stop_request("p", None, [])


def test_stop_savepoint_kind() -> None:
    assert stops.stop_savepoint(StopMode.SAVEPOINT, [L.RUNNING]) is CheckpointKind.SAVEPOINT
    assert stops.stop_savepoint(StopMode.DRAIN, [L.RUNNING, L.FINISHED]) is None
    drained = stops.stop_savepoint(StopMode.DRAIN, [L.CLOSED, L.FINISHED])
    assert drained is CheckpointKind.DRAINED_SAVEPOINT
    assert stops.savepoint_reason(CheckpointKind.DRAINED_SAVEPOINT) is TriggerReason.DRAIN
    assert stops.savepoint_reason(CheckpointKind.SAVEPOINT) is TriggerReason.SAVEPOINT
    assert stops.completed_at_once(CheckpointState.COMPLETED)
    assert not stops.completed_at_once(None)


@pytest.mark.parametrize(
    ("the_stop", "lifecycles", "expected"),
    [
        (None, [L.RUNNING], CheckpointKind.CHECKPOINT),
        (stop(), [L.FINISHED], None),  # waits for the savepoint
        (stop(state=StopState.COMPLETED), [L.FINISHED], None),
        (stop(StopMode.DRAIN), [L.FINISHED, L.CLOSED], CheckpointKind.DRAINED_SAVEPOINT),
        (stop(StopMode.DRAIN), [L.FINISHED, L.RUNNING], CheckpointKind.CHECKPOINT),
        (stop(state=StopState.FAILED), [L.FINISHED], CheckpointKind.CHECKPOINT),
    ],
)
def test_eager_kind(
    the_stop: StopRequest | None, lifecycles: list[L], expected: CheckpointKind | None
) -> None:
    assert stops.eager_kind(the_stop, lifecycles) is expected


def test_resume() -> None:
    suspended = stop(state=StopState.COMPLETED)
    assert stops.check_resume("p", suspended) is suspended
    for not_suspended in (None, stop(state=StopState.FAILED), stop(state=StopState.RESUMED)):
        with pytest.raises(StopRequestError, match="is not suspended"):
            stops.check_resume("p", not_suspended)
    with pytest.raises(DrainedSavepointError, match="cannot be resumed"):
        stops.check_resume("p", stop(StopMode.DRAIN, StopState.COMPLETED))
    with pytest.raises(StopRequestError, match="is draining"):
        stops.check_resume("p", stop(StopMode.DRAIN))
    with pytest.raises(StopRequestError, match="still in progress"):
        stops.check_resume("p", stop())
    assert stops.resume_needs_checkpoint([L.CLOSED, L.FINISHED])
    assert not stops.resume_needs_checkpoint([L.CLOSED, L.SUSPENDED])
