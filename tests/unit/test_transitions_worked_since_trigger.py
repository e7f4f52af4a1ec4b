"""The completion's rule for an idle stage the plan saw without a finished split: its finished
splits now are work done after the trigger, not part of the checkpoint (their transactions
belong to later ones). The sequence through the coordinator:
tests/integration/test_suspended_late_stage_record.py.
"""

from __future__ import annotations

from airflow_finalckpt.core import transitions as rules
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointState,
    SinkTransaction,
    StageSnapshot,
    StageStatus,
    TriggerReason,
)
from airflow_finalckpt.core.plan import CheckpointPlan
from airflow_finalckpt.core.views import CheckpointInfo


def test_worked_since_trigger_only_for_a_stage_planned_without_splits() -> None:
    worked = StageSnapshot(finished_splits=frozenset({"s0"}))
    assert rules.worked_since_trigger(StageStatus.NOT_STARTED, worked)
    assert not rules.worked_since_trigger(StageStatus.PARTIALLY_FINISHED, worked)
    assert not rules.worked_since_trigger(StageStatus.NOT_STARTED, StageSnapshot(watermark=3))
    assert not rules.worked_since_trigger(StageStatus.NOT_STARTED, StageSnapshot())


def test_build_record_keeps_a_late_suspended_stage_not_started() -> None:
    plan = CheckpointPlan((), (), (), (), statuses={"late": StageStatus.NOT_STARTED})
    info = CheckpointInfo(
        3,
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
    late = StageSnapshot(finished_splits=frozenset({"l-0", "l-1"}), watermark=9)
    record = rules.build_record("key", info, {}, {}, {"late": late}, {}, {}, "fp", 200.0)
    stage = record.stages["late"]
    assert stage.status is StageStatus.NOT_STARTED
    assert stage.finished_splits == frozenset()


def test_build_record_gives_an_idle_restored_stage_its_uncommitted_transactions() -> None:
    plan = CheckpointPlan((), (), (), (), statuses={"restored": StageStatus.PARTIALLY_FINISHED})
    info = CheckpointInfo(
        3,
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
    assert rules.needs_transactions(plan, {}) == ["restored"]
    progress = StageSnapshot(finished_splits=frozenset({"r-0"}))
    pending = [SinkTransaction(sink_id="k", txn_id="t-r-0", checkpoint_id=2)]
    record = rules.build_record(
        "key", info, {}, {}, {"restored": progress}, {"restored": pending}, {}, "fp", 200.0
    )
    stage = record.stages["restored"]
    assert stage.status is StageStatus.PARTIALLY_FINISHED
    assert stage.finished_splits == {"r-0"}
    assert [x.txn_id for x in stage.pending_transactions] == ["t-r-0"]
