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
