"""The coordinator's checkpoint rules on plain values, no database: trigger gate, acknowledgement,
what a completed checkpoint records, subsumption, retention, expiry, the stop a savepoint settles.
(tests/unit/test_coordinator_rules.py drives the same rules through SQLite and PostgreSQL.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from airflow_finalckpt.core import failure
from airflow_finalckpt.core import transitions as rules
from airflow_finalckpt.core.errors import IllegalTransitionError
from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.graph import Stage, StageGraph
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    EndOfData,
    FinishedStageEnd,
    SinkTransaction,
    StageCheckpointRecord,
    StageLifecycle,
    StageProgress,
    StageSnapshot,
    StageStatus,
    StateHandle,
    StopMode,
    StopState,
    TriggerReason,
)
from airflow_finalckpt.core.plan import CheckpointPlan, calculate_plan
from airflow_finalckpt.core.views import (
    AckOutcome,
    AckRow,
    AckTarget,
    CheckpointInfo,
    PipelineSnapshot,
    StageRow,
    StopRequest,
    WaitingStage,
    closable_on,
    needs_final_checkpoint,
    timed_out,
)


def row(
    sid: str,
    lifecycle: StageLifecycle = StageLifecycle.RUNNING,
    *,
    epoch: int = 1,
    splits: tuple[str, ...] = (),
    threshold: int | None = None,
    final: StageSnapshot | None = None,
    closed: int | None = None,
) -> StageRow:
    progress: dict[str, Any] = StageSnapshot(finished_splits=frozenset(splits)).model_dump(
        mode="json"
    )
    return StageRow(
        stage_id=sid,
        lifecycle=lifecycle,
        epoch=epoch,
        total_splits=4,
        finish_threshold=threshold,
        closed_checkpoint_id=closed,
        updated_at=0.0,
        progress_data=progress,
        final_data=None if final is None else final.model_dump(mode="json"),
    )


def stop(
    mode: StopMode = StopMode.SAVEPOINT,
    state: StopState = StopState.REQUESTED,
    savepoint_id: int | None = 7,
) -> StopRequest:
    return StopRequest(1, mode, state, savepoint_id, "me", 0.0, None, None)


def txn(txn_id: str, checkpoint_id: int | None = None) -> SinkTransaction:
    return SinkTransaction(sink_id="s", txn_id=txn_id, checkpoint_id=checkpoint_id)


def graph(edges: Mapping[str, tuple[str, ...]]) -> StageGraph:
    return StageGraph.build(Stage(sid, ups) for sid, ups in edges.items())


# ---------------------------------------------------------------------------------- trigger


@pytest.mark.parametrize(
    ("reason", "the_stop", "pending", "allowed"),
    [
        (TriggerReason.PERIODIC, None, False, True),
        (TriggerReason.PERIODIC, None, True, False),  # one pending: no periodic one
        (TriggerReason.MANUAL, None, True, True),
        (TriggerReason.MANUAL, stop(), False, False),  # a savepoint in progress
        (TriggerReason.MANUAL, stop(state=StopState.COMPLETED), False, False),  # suspended
        (TriggerReason.MANUAL, stop(StopMode.DRAIN, StopState.COMPLETED), False, False),
        (TriggerReason.MANUAL, stop(StopMode.DRAIN), False, True),  # draining goes on
        (TriggerReason.MANUAL, stop(state=StopState.FAILED), False, True),
        (TriggerReason.MANUAL, stop(state=StopState.RESUMED), False, True),
    ],
)
def test_may_trigger(
    reason: TriggerReason, the_stop: StopRequest | None, pending: bool, allowed: bool
) -> None:
    assert rules.may_trigger(reason, the_stop, pending) is allowed


def progress_of(rows: dict[str, StageRow]) -> dict[str, StageProgress]:
    """What the plan calculator needs of each stage row."""
    return {
        sid: StageProgress(
            lifecycle=r.lifecycle,
            finished_splits=r.progress.finished_splits,
            total_splits=r.total_splits,
        )
        for sid, r in rows.items()
    }


def lifecycles_of(rows: dict[str, StageRow]) -> dict[str, StageLifecycle]:
    return {sid: r.lifecycle for sid, r in rows.items()}


def test_a_trigger_covers_finished_unclosed_stages_only() -> None:
    g = graph({"a": (), "b": ("a",), "c": ("b",)})
    rows = {
        "a": row("a", StageLifecycle.CLOSED, closed=1),
        "b": row("b", StageLifecycle.FINISHED, threshold=2),
        "c": row("c", StageLifecycle.RUNNING, splits=("p0",)),
    }
    plan = calculate_plan(g, progress_of(rows))
    assert plan.to_ack == ("c",) and plan.to_trigger == ("c",)
    assert rules.finished_unclosed(plan, lifecycles_of(rows)) == ["b"]
    assert plan.partially_finished == {"c": frozenset({"p0"})}


def test_a_stage_with_two_upstreams_is_a_trigger_source_once_both_finished() -> None:
    g = graph({"a": (), "b": (), "join": ("a", "b")})
    rows = {"a": row("a", StageLifecycle.FINISHED, threshold=1), "b": row("b"), "join": row("join")}
    plan = calculate_plan(g, progress_of(rows))
    assert plan.to_ack == ("b", "join") and plan.to_trigger == ("b",)  # join still waits for b
    rows["b"] = row("b", StageLifecycle.FINISHED, threshold=2)
    plan = calculate_plan(g, progress_of(rows))
    assert plan.to_ack == ("join",) and plan.to_trigger == ("join",)
    assert set(plan.fully_finished) == {"a", "b"}
    assert rules.finished_unclosed(plan, lifecycles_of(rows)) == ["a", "b"]


# ---------------------------------------------------------------------------------- ack


def target(state: CheckpointState, *, due: bool, acked: bool = False) -> AckTarget:
    return AckTarget(state=state, acks_pending=1, triggered_at=0.0, due=due, acked=acked)


def test_ack_gate() -> None:
    assert rules.ack_gate(1, "a", target(CheckpointState.PENDING, due=True)) is None
    for state in (CheckpointState.COMPLETED, CheckpointState.ABORTED, CheckpointState.DISCARDED):
        assert rules.ack_gate(1, "a", target(state, due=True)) is AckOutcome.NOT_PENDING
        assert rules.ack_gate(1, "a", target(state, due=False)) is AckOutcome.NOT_PENDING
    acked = target(CheckpointState.PENDING, due=False, acked=True)
    assert rules.ack_gate(1, "a", acked) is AckOutcome.DUPLICATE
    assert rules.ack_gate(1, "a", acked, joins=True) is AckOutcome.DUPLICATE
    with pytest.raises(IllegalTransitionError, match="does not wait for stage 'b'"):
        rules.ack_gate(1, "b", target(CheckpointState.PENDING, due=False))
    # a finish joining a checkpoint that did not wait for it goes on
    assert rules.ack_gate(1, "b", target(CheckpointState.PENDING, due=False), joins=True) is None


def test_out_of_order_ack_does_not_stamp_new_transactions() -> None:
    assert rules.stamps_on_ack(5, None)
    assert rules.stamps_on_ack(5, 4)
    assert not rules.stamps_on_ack(5, 6)  # acked 6 first: its snapshot lacks them


def test_ack_snapshot_carries_every_uncommitted_transaction() -> None:
    progress = StageSnapshot(finished_splits=frozenset({"p"}), watermark=3)
    snap = rules.ack_snapshot(progress, [txn("t1", 1), txn("t2")])
    assert snap.finished_splits == {"p"} and snap.watermark == 3
    assert [x.txn_id for x in snap.pending_transactions] == ["t1", "t2"]


def test_merge_progress() -> None:
    h1 = StateHandle(name="s", path="state/1", size=1, sha256="0" * 64)
    h2 = StateHandle(name="s", path="state/2", size=1, sha256="1" * 64)
    eod = EndOfData(manifest=["x"])
    current = StageSnapshot(finished_splits=frozenset({"a"}), state=(h1,), watermark=10)
    delta = StageSnapshot(finished_splits=frozenset({"b"}), state=(h2,), watermark=5)
    merged = rules.merge_progress(current, delta)
    assert merged.finished_splits == {"a", "b"}
    assert merged.state == (h2,)
    assert merged.watermark == 10  # never goes back
    assert rules.merge_progress(current, delta, replace_state=False).state == (h1,)
    assert rules.merge_progress(current, StageSnapshot(end_of_data=eod)).end_of_data == eod
    assert rules.merge_progress(StageSnapshot(), StageSnapshot()).watermark is None


# ---------------------------------------------------------------------------------- complete


def info(plan_statuses: Mapping[str, StageStatus], cid: int = 3) -> CheckpointInfo:
    plan = CheckpointPlan((), (), (), (), statuses=dict(plan_statuses))
    return CheckpointInfo(
        cid,
        CheckpointKind.CHECKPOINT,
        TriggerReason.MANUAL,
        CheckpointState.PENDING,
        plan,
        0,
        100.0,
        None,
        None,
        None,
        None,
    )


def test_record_refines_statuses_from_acks_and_final_snapshots() -> None:
    handle = StateHandle(name="s", path="state/x", size=5, sha256="2" * 64)
    final = StageSnapshot(
        finished_splits=frozenset({"p0", "p1"}),
        state=(handle,),
        end_of_data=EndOfData(manifest=["m"]),
    )
    statuses = {
        "fin": StageStatus.FULLY_FINISHED,  # finished before the trigger: final snapshot
        "byfinish": StageStatus.RUNNING,  # finished while pending: acked by finish
        "partial": StageStatus.RUNNING,
        "running": StageStatus.RUNNING,
        "restored": StageStatus.PARTIALLY_FINISHED,  # restored progress, not started again
        "stateful": StageStatus.NOT_STARTED,  # restored RUNNING state, no split finished
        "late": StageStatus.NOT_STARTED,  # started after the trigger
        "fresh": StageStatus.NOT_STARTED,
    }
    acks = {
        "byfinish": AckRow("byfinish", True, final),
        "partial": AckRow("partial", False, StageSnapshot(finished_splits=frozenset({"p"}))),
        "running": AckRow("running", False, StageSnapshot(state=(handle,))),
    }
    finished = {
        "fin": FinishedStageEnd(
            end_of_data=final.end_of_data, watermark=final.watermark, finished_count=2
        )
    }
    unstarted = {
        "restored": StageSnapshot(finished_splits=frozenset({"r1"}), state=(handle,)),
        "stateful": StageSnapshot(state=(handle,), watermark=5),
        "fresh": StageSnapshot(),
    }
    # every stage recorded without an acknowledgement (their finished splits need them)
    assert rules.needs_transactions(info(statuses).plan, acks) == [
        "fin",
        "restored",
        "stateful",
        "late",
        "fresh",
    ]
    record = rules.build_record(
        "key",
        info(statuses),
        acks,
        finished,
        unstarted,
        {"fin": [txn("t", 2)]},
        {"g": 1},
        "fp",
        200.0,
    )
    stages = record.stages
    assert {sid: s.status for sid, s in stages.items()} == {
        "fin": StageStatus.FULLY_FINISHED,
        "byfinish": StageStatus.FULLY_FINISHED,
        "partial": StageStatus.PARTIALLY_FINISHED,
        "running": StageStatus.RUNNING,
        "restored": StageStatus.PARTIALLY_FINISHED,
        "stateful": StageStatus.RUNNING,  # restorable: restore resumes it with its state
        "late": StageStatus.NOT_STARTED,
        "fresh": StageStatus.NOT_STARTED,
    }
    # fully finished stages carry no state, but their end_of_data and transactions
    assert stages["fin"].state == () and stages["fin"].end_of_data == final.end_of_data
    assert [x.txn_id for x in stages["fin"].pending_transactions] == ["t"]
    assert stages["byfinish"].state == ()
    # ... and no split ids: a count (metadata v2 stores a flag, not the finished splits)
    assert stages["fin"].finished_splits == frozenset() and stages["fin"].done_splits == 2
    assert stages["byfinish"].finished_splits == frozenset()
    assert stages["byfinish"].done_splits == 2
    assert stages["running"].state == (handle,)
    assert stages["restored"].finished_splits == {"r1"}
    assert stages["restored"].state == (handle,)
    assert stages["stateful"].state == (handle,) and stages["stateful"].watermark == 5
    # nothing of a stage that started after the trigger: its progress is past the cut
    assert stages["late"] == StageCheckpointRecord(stage_id="late", status=StageStatus.NOT_STARTED)
    assert stages["fresh"] == StageCheckpointRecord(
        stage_id="fresh", status=StageStatus.NOT_STARTED
    )
    assert (record.checkpoint_id, record.triggered_at, record.completed_at) == (3, 100.0, 200.0)
    assert record.graph == {"g": 1} and record.graph_fingerprint == "fp"


def test_a_stage_with_restored_progress_that_started_since_the_trigger_is_refused() -> None:
    statuses = {
        "restored": StageStatus.PARTIALLY_FINISHED,
        "idle": StageStatus.PARTIALLY_FINISHED,
        "late": StageStatus.NOT_STARTED,
        "acked": StageStatus.PARTIALLY_FINISHED,
        "fin": StageStatus.FULLY_FINISHED,
    }
    acks = {"acked": AckRow("acked", False, StageSnapshot(finished_splits=frozenset({"a"})))}
    unstarted = {"idle": StageSnapshot(finished_splits=frozenset({"i"}))}
    plan = info(statuses).plan
    assert rules.started_since_trigger(plan, acks, unstarted) == ["restored"]
    unstarted["restored"] = StageSnapshot(finished_splits=frozenset({"r"}))
    assert rules.started_since_trigger(plan, acks, unstarted) == []


def test_completion_subsumes_older_pending_checkpoints_but_never_savepoints() -> None:
    pending = [
        (1, CheckpointKind.CHECKPOINT),
        (2, CheckpointKind.SAVEPOINT),
        (3, CheckpointKind.DRAINED_SAVEPOINT),
        (4, CheckpointKind.CHECKPOINT),
        (6, CheckpointKind.CHECKPOINT),  # newer: stays pending
    ]
    assert rules.subsumed_by(5, pending) == [1, 4]


def test_retention_keeps_the_newest() -> None:
    completed = [(9, "p9"), (8, None), (7, "p7"), (5, "p5")]
    assert list(rules.beyond_retention(completed, 2)) == [(7, "p7"), (5, "p5")]
    assert list(rules.beyond_retention(completed, 10)) == []


def test_a_savepoint_settles_only_its_own_stop_in_progress() -> None:
    assert rules.stop_settled_by(stop(savepoint_id=7), 7) == stop(savepoint_id=7)
    assert rules.stop_settled_by(stop(savepoint_id=7), 6) is None
    assert rules.stop_settled_by(stop(state=StopState.COMPLETED), 7) is None
    assert rules.stop_settled_by(stop(StopMode.DRAIN), 7) is not None  # the drained savepoint
    assert rules.stop_settled_by(None, 7) is None


# ---------------------------------------------------------------------------------- expiry


def test_timed_out_with_plain_numbers() -> None:
    pending = [(1, 100.0), (2, 150.0), (3, 199.0)]
    assert timed_out(pending, now=200.0, timeout_s=50.0) == [1]  # 150 is not < 150
    assert timed_out(pending, now=260.0, timeout_s=50.0) == [1, 2, 3]
    assert timed_out([], now=1e9, timeout_s=0.0) == []


def test_failure_reasons_and_their_details() -> None:
    assert failure.expired(600.0) == "timed out after 600 s"
    assert failure.declined("b", "lost") == "declined by stage 'b': lost"
    assert failure.subsumed(4) == "subsumed by checkpoint 4"
    assert failure.write_failed(OSError("EIO")) == "writing checkpoint metadata failed: EIO"
    assert failure.restored("s3://x") == "pipeline restored from s3://x"
    assert failure.savepoint_aborted(3, "x") == "savepoint 3 aborted: x"
    assert CheckpointFailureReason("expired") is CheckpointFailureReason.EXPIRED
    assert {r.value for r in CheckpointFailureReason} == {
        "expired",
        "declined",
        "subsumed",
        "write_failed",
        "restored",
        "manual",
    }


# ---------------------------------------------------------------------------------- closing


@pytest.mark.parametrize(
    ("lifecycle", "the_stop", "first", "expected"),
    [
        (StageLifecycle.FINISHED, None, 4, 4),
        (StageLifecycle.FINISHED, None, None, None),
        (StageLifecycle.FINISHED, stop(), 4, None),  # waits for the savepoint
        (StageLifecycle.FINISHED, stop(state=StopState.COMPLETED), 4, 4),
        (StageLifecycle.FINISHED, stop(StopMode.DRAIN), 4, 4),
        (StageLifecycle.CLOSED, stop(), None, 2),  # its own, whatever happens
        (StageLifecycle.RUNNING, None, 4, None),
        (StageLifecycle.SUSPENDED, None, 4, None),
    ],
)
def test_closable_on(
    lifecycle: StageLifecycle, the_stop: StopRequest | None, first: int | None, expected: int | None
) -> None:
    assert closable_on(lifecycle, 2, the_stop, first) == expected


@pytest.mark.parametrize(
    ("lifecycle", "the_stop", "candidate", "needed"),
    [
        (StageLifecycle.FINISHED, None, False, True),
        (StageLifecycle.FINISHED, None, True, False),
        (StageLifecycle.FINISHED, stop(), False, False),  # the savepoint will do
        (StageLifecycle.FINISHED, stop(state=StopState.COMPLETED), False, False),  # suspended
        (StageLifecycle.FINISHED, stop(state=StopState.FAILED), False, True),
        (StageLifecycle.CLOSED, None, False, False),
        (StageLifecycle.RUNNING, None, False, False),
    ],
)
def test_needs_final_checkpoint(
    lifecycle: StageLifecycle, the_stop: StopRequest | None, candidate: bool, needed: bool
) -> None:
    assert needs_final_checkpoint(lifecycle, the_stop, has_candidate=candidate) is needed


def test_pipeline_snapshot_uses_the_same_rules() -> None:
    waiting = WaitingStage("x", StageLifecycle.FINISHED, 1, 3, None, None, None)
    snap = PipelineSnapshot("k", 10.0, {"x": waiting}, None, ((5, 100.0),))
    assert snap.timed_out(111.0) == [5] and snap.timed_out(109.0) == []
    assert snap.final_checkpoint_work("x", 109.0)  # no candidate
    assert snap.closable_checkpoint("x") is None
    assert snap.closable_checkpoint("unknown") is None
