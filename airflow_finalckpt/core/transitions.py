"""The checkpoint rules of the coordinator as pure functions over plain values: whether a
checkpoint may be triggered, what an acknowledgement does, what a completed checkpoint records,
subsumes and discards, what times out. The store reads the values, these decide, the store
writes the outcome (``coordination.coordinator``); no database here, so each rule is tested on
values alone (tests/unit/test_transitions*.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from airflow_finalckpt.core.errors import IllegalTransitionError
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    CheckpointState,
    FinishedStageEnd,
    SinkTransaction,
    StageCheckpointRecord,
    StageLifecycle,
    StageSnapshot,
    StageStatus,
    StopState,
    TriggerReason,
)
from airflow_finalckpt.core.plan import CheckpointPlan
from airflow_finalckpt.core.views import (
    AckOutcome,
    AckRow,
    AckTarget,
    CheckpointInfo,
    StopRequest,
    savepoint_in_progress,
)


def may_trigger(reason: TriggerReason, stop: StopRequest | None, has_pending: bool) -> bool:
    """No checkpoint while a run is suspended, drained or stopping with a savepoint; no
    periodic one while another is pending.
    """
    if stop is not None and (stop.state is StopState.COMPLETED or savepoint_in_progress(stop)):
        return False
    return not (reason is TriggerReason.PERIODIC and has_pending)


def finished_unclosed(plan: CheckpointPlan, lifecycles: Mapping[str, StageLifecycle]) -> list[str]:
    """Finished, unclosed stages a new checkpoint covers as FULLY_FINISHED: their not yet
    covered transactions become committable once it completes.
    """
    finished = StageLifecycle.FINISHED
    return [sid for sid in plan.fully_finished if lifecycles[sid] is finished]


def ack_gate(
    checkpoint_id: int, stage_id: str, target: AckTarget, *, joins: bool = False
) -> AckOutcome | None:
    """NOT_PENDING for a checkpoint no longer pending, DUPLICATE for one the stage acknowledged
    already; IllegalTransitionError for one that does not wait for the stage, unless a finish
    ``joins`` it (``transitions_eager``); None: go on.
    """
    if target.state is not CheckpointState.PENDING:
        return AckOutcome.NOT_PENDING
    if target.due:
        return None
    if target.acked:
        return AckOutcome.DUPLICATE
    if joins:
        return None
    raise IllegalTransitionError(
        f"checkpoint {checkpoint_id} does not wait for stage {stage_id!r} "
        f"(it was not running when the checkpoint was triggered)"
    )


def stamps_on_ack(checkpoint_id: int, newest_acked: int | None) -> bool:
    """An acknowledgement covers the stage's new transactions unless the stage already acked
    a newer checkpoint (out of order): that newer snapshot does not hold them.
    """
    return newest_acked is None or newest_acked < checkpoint_id


def ack_snapshot(progress: StageSnapshot, uncommitted: Iterable[SinkTransaction]) -> StageSnapshot:
    """What an acknowledgement records: the durable progress and every uncommitted transaction."""
    return progress.model_copy(update={"pending_transactions": tuple(uncommitted)})


def merge_progress(
    current: StageSnapshot, delta: StageSnapshot, *, replace_state: bool = True
) -> StageSnapshot:
    """Durable progress after a batch or snapshot: splits add up, the watermark only rises,
    the state is replaced (unless ``replace_state`` is False).
    """
    watermarks = [w for w in (current.watermark, delta.watermark) if w is not None]
    return StageSnapshot(
        finished_splits=current.finished_splits | delta.finished_splits,
        state=delta.state if replace_state else current.state,
        watermark=max(watermarks) if watermarks else None,
        end_of_data=delta.end_of_data or current.end_of_data,
        split_list_sha256=delta.split_list_sha256 or current.split_list_sha256,
    )


def needs_transactions(plan: CheckpointPlan, acks: Mapping[str, AckRow]) -> list[str]:
    """Stages recorded without an acknowledgement: from their final snapshot (FULLY_FINISHED)
    or from their idle progress (restored, or suspended). Their uncommitted transactions must
    be read to complete the checkpoint: a record that keeps a stage's finished splits without
    the transactions holding their output would lose that output on restore.
    """
    return [sid for sid in plan.statuses if sid not in acks]


def acked_status(ack: AckRow) -> StageStatus:
    """How an acknowledgement refines a stage's planned status."""
    if ack.by_finish:
        return StageStatus.FULLY_FINISHED
    if ack.snapshot.finished_splits:
        return StageStatus.PARTIALLY_FINISHED
    return StageStatus.RUNNING


def stage_record(stage_id: str, status: StageStatus, snap: StageSnapshot) -> StageCheckpointRecord:
    """One stage in a completed checkpoint: a fully finished one is a flag with its end_of_data,
    transactions and finished split count; no state, no split ids.
    """
    if status is StageStatus.FULLY_FINISHED:
        return StageCheckpointRecord(
            stage_id=stage_id,
            status=status,
            pending_transactions=snap.pending_transactions,
            watermark=snap.watermark,
            end_of_data=snap.end_of_data,
            finished_count=len(snap.finished_splits),
        )
    return StageCheckpointRecord(
        stage_id=stage_id,
        status=status,
        finished_splits=snap.finished_splits,
        state=snap.state,
        pending_transactions=snap.pending_transactions,
        watermark=snap.watermark,
        split_list_sha256=snap.split_list_sha256,
    )


def finished_stage_record(
    stage_id: str, end: FinishedStageEnd | None, uncommitted: Sequence[SinkTransaction]
) -> StageCheckpointRecord:
    """A stage finished before the checkpoint was triggered: from its end alone."""
    end = end or FinishedStageEnd()
    return StageCheckpointRecord(
        stage_id=stage_id,
        status=StageStatus.FULLY_FINISHED,
        pending_transactions=tuple(uncommitted),
        watermark=end.watermark,
        end_of_data=end.end_of_data,
        finished_count=end.finished_count,
    )


def unstarted_status(snap: StageSnapshot) -> StageStatus:
    """The status of a stage without a live attempt, from its (restored) progress: restore
    resumes it if it carries finished splits or anything snapshotted.
    """
    if snap.finished_splits:
        return StageStatus.PARTIALLY_FINISHED
    if snap.state or snap.pending_transactions or snap.watermark is not None:
        return StageStatus.RUNNING
    return StageStatus.NOT_STARTED


def started_since_trigger(
    plan: CheckpointPlan, acks: Mapping[str, AckRow], unstarted: Mapping[str, StageSnapshot]
) -> list[str]:
    """Stages the plan recorded with restored progress (not NOT_STARTED, not finished) that
    started work after the trigger without acknowledging: their progress at the trigger is
    gone, so the checkpoint cannot record them (it is aborted; the next one asks them).
    """
    return [
        sid
        for sid, status in plan.statuses.items()
        if sid not in acks
        and sid not in unstarted
        and status not in (StageStatus.FULLY_FINISHED, StageStatus.NOT_STARTED)
    ]


def worked_since_trigger(planned: StageStatus, snap: StageSnapshot) -> bool:
    """A stage planned NOT_STARTED (no finished split at the trigger) that is idle again with
    finished splits: it started after the trigger, ran batches and was suspended by a later
    savepoint. Those splits' sink transactions belong to later checkpoints; recorded here,
    a restore would skip the splits and never commit their output.
    """
    return planned is StageStatus.NOT_STARTED and bool(snap.finished_splits)


def build_record(
    pipeline_key: str,
    checkpoint: CheckpointInfo,
    acks: Mapping[str, AckRow],
    finished: Mapping[str, FinishedStageEnd],
    unstarted: Mapping[str, StageSnapshot],
    uncommitted: Mapping[str, Sequence[SinkTransaction]],
    graph: Mapping[str, object],
    fingerprint: str,
    now: float,
    *,
    built: Mapping[str, StageCheckpointRecord] | None = None,
) -> CheckpointRecord:
    """The ``_metadata`` of a fully acknowledged checkpoint: acknowledged stages as they
    answered, stages finished before the trigger from their end (``finished``: no split ids,
    no state) and uncommitted transactions; the others from their progress and uncommitted
    transactions if they have not started work since (``unstarted``: what the trigger saw),
    else NOT_STARTED (they started after the trigger: nothing of them belongs to this
    checkpoint; ``started_since_trigger`` refuses those that had restored progress;
    ``worked_since_trigger``: those idle again). ``built``: stages finished before the
    trigger already built from their stored entry, without transactions (instead of their
    ``finished`` end).
    """
    built = built or {}
    stages: dict[str, StageCheckpointRecord] = {}
    for sid, status in checkpoint.plan.statuses.items():
        ack = acks.get(sid)
        if ack is not None:
            stages[sid] = stage_record(sid, acked_status(ack), ack.snapshot)
        elif status is StageStatus.FULLY_FINISHED:
            txns = uncommitted.get(sid, ())
            ready = built.get(sid)
            if ready is None:
                stages[sid] = finished_stage_record(sid, finished.get(sid), txns)
            else:
                stages[sid] = (
                    ready.model_copy(update={"pending_transactions": tuple(txns)})
                    if txns
                    else ready
                )
        elif sid in unstarted and not worked_since_trigger(status, unstarted[sid]):
            snap = unstarted[sid]
            txns = tuple(uncommitted.get(sid, ()))
            if txns != snap.pending_transactions:
                snap = snap.model_copy(update={"pending_transactions": txns})
            stages[sid] = stage_record(sid, unstarted_status(snap), snap)
        else:
            stages[sid] = StageCheckpointRecord(stage_id=sid, status=StageStatus.NOT_STARTED)
    return CheckpointRecord(
        pipeline_key=pipeline_key,
        checkpoint_id=checkpoint.checkpoint_id,
        kind=checkpoint.kind,
        reason=checkpoint.reason,
        graph=dict(graph),
        graph_fingerprint=fingerprint,
        triggered_at=checkpoint.triggered_at,
        completed_at=now,
        stages=stages,
    )


def pre_encoded(
    record: CheckpointRecord, acks: Mapping[str, AckRow], entries: Mapping[str, str]
) -> dict[str, tuple[StageCheckpointRecord, str]]:
    """The stages of ``record`` built from their end alone (``finished_stage_record``: fully
    finished, no acknowledgement) whose end was read from a stored entry (``entries``, see
    ``StoreReader.finished_stages``), each with that entry: what the metadata codec
    writes for them (``codec.encoded_finished``).
    """
    return {
        sid: (stage, entries[sid])
        for sid, stage in record.stages.items()
        if sid in entries and sid not in acks and stage.status is StageStatus.FULLY_FINISHED
    }


def subsumed_by(checkpoint_id: int, pending: Iterable[tuple[int, CheckpointKind]]) -> list[int]:
    """Older pending checkpoints a completed one makes obsolete (savepoints are never
    subsumed).
    """
    return [
        cid for cid, kind in pending if cid < checkpoint_id and kind is CheckpointKind.CHECKPOINT
    ]


def beyond_retention(
    completed: Sequence[tuple[int, str | None]], retain: int
) -> Sequence[tuple[int, str | None]]:
    """Completed checkpoints (newest first) that retention discards: all but the newest
    ``retain``.
    """
    return completed[retain:]


def stop_settled_by(stop: StopRequest | None, checkpoint_id: int) -> StopRequest | None:
    """The stop in progress whose savepoint is ``checkpoint_id``: it completes when that
    checkpoint completes and fails when it is aborted.
    """
    if (
        stop is not None
        and stop.state is StopState.REQUESTED
        and stop.savepoint_id == checkpoint_id
    ):
        return stop
    return None
