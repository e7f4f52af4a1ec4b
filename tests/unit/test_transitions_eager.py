"""Coalesced eager checkpoints on plain values (core/transitions_eager.py): which pending
checkpoint a finishing stage joins and which ones it acknowledges with its final snapshot."""

from __future__ import annotations

from airflow_finalckpt.core.model import CheckpointKind, TriggerReason
from airflow_finalckpt.core.transitions_eager import (
    FinishJoin,
    PendingCheckpoint,
    finish_acks,
    join_target,
)

EAGER = (CheckpointKind.CHECKPOINT, TriggerReason.EAGER_FINAL)
PERIODIC = (CheckpointKind.CHECKPOINT, TriggerReason.PERIODIC)
SAVEPOINT = (CheckpointKind.SAVEPOINT, TriggerReason.SAVEPOINT)


def pending(
    cid: int, what: tuple[CheckpointKind, TriggerReason] = EAGER, *, waits: bool, acked: bool
) -> PendingCheckpoint:
    kind, reason = what
    return PendingCheckpoint(cid, kind, reason, waits_for_stage=waits, acked_by_stage=acked)


def test_nothing_pending_triggers_a_new_checkpoint() -> None:
    assert join_target([]) is None
    assert finish_acks([], may_join=True) is None


def test_a_finish_joins_the_eager_checkpoint_that_waits_for_it() -> None:
    """Fan-in: the first finish triggered 7; every further finish acknowledges 7 by finish."""
    got = finish_acks([pending(7, waits=True, acked=False)], may_join=True)
    assert got == FinishJoin(threshold=7, by_finish=(7,), joined=())


def test_a_stage_started_after_the_trigger_joins_without_being_waited_for() -> None:
    got = finish_acks([pending(7, waits=False, acked=False)], may_join=True)
    assert got == FinishJoin(threshold=7, by_finish=(7,), joined=(7,))


def test_only_eager_checkpoints_are_joined() -> None:
    for what in (PERIODIC, SAVEPOINT, (CheckpointKind.DRAINED_SAVEPOINT, TriggerReason.DRAIN)):
        assert join_target([pending(7, what, waits=True, acked=False)]) is None


def test_nothing_is_joined_when_finishing_would_not_trigger_an_eager_checkpoint() -> None:
    """A drain's last finish triggers the drained savepoint; a suspended run triggers nothing."""
    assert finish_acks([pending(7, waits=True, acked=False)], may_join=False) is None


def test_a_checkpoint_the_stage_acknowledged_before_finishing_is_not_joined() -> None:
    """It holds a pre-finish snapshot: the stage waits for the first checkpoint after finish."""
    assert join_target([pending(7, waits=False, acked=True)]) is None


def test_no_join_before_a_checkpoint_the_stage_acknowledged() -> None:
    """Eager 7 did not plan the stage, periodic 8 holds its pre-finish snapshot: joining 7 would
    let the stage close on 8 (>= 7) without its final state. A new checkpoint is triggered."""
    got = [pending(7, waits=False, acked=False), pending(8, PERIODIC, waits=False, acked=True)]
    assert join_target(got) is None
    assert finish_acks(got, may_join=True) is None


def test_the_oldest_eager_checkpoint_after_the_last_acknowledged_one_is_joined() -> None:
    got = [
        pending(5, waits=False, acked=True),
        pending(6, PERIODIC, waits=True, acked=False),
        pending(7, waits=True, acked=False),
        pending(8, waits=False, acked=False),
    ]
    assert join_target(got) == 7
    # 6 waits for the stage: acknowledged by finish as always; 7 and 8 from the threshold on;
    # 8 did not plan the stage: joined (its count of pending acknowledgements stays).
    assert finish_acks(got, may_join=True) == FinishJoin(7, (6, 7, 8), (8,))


def test_every_pending_checkpoint_from_the_threshold_on_gets_the_final_snapshot() -> None:
    """Whatever completes first at or after the threshold must hold the finished stage."""
    got = [
        pending(3, waits=False, acked=False),
        pending(4, SAVEPOINT, waits=False, acked=False),
        pending(9, PERIODIC, waits=True, acked=False),
    ]
    join = finish_acks(got, may_join=True)
    assert join is not None and join.threshold == 3
    assert join.by_finish == (3, 4, 9) and join.joined == (3, 4)
    assert all(c.checkpoint_id in join.by_finish for c in got if c.checkpoint_id >= 3)


def test_the_input_order_does_not_matter() -> None:
    got = [pending(8, waits=True, acked=False), pending(7, waits=False, acked=False)]
    assert finish_acks(got, may_join=True) == FinishJoin(7, (7, 8), (7,))


def test_no_join_before_a_checkpoint_whose_plan_lacks_the_stage() -> None:
    """A stage added by a changed DAG after 7 and 8 were triggered: neither can hold it, so it
    never closes on them; with 9 planning it, 9 is joined."""
    lacking = [
        PendingCheckpoint(
            7, *EAGER, waits_for_stage=False, acked_by_stage=False, plans_stage=False
        ),
        PendingCheckpoint(
            8, *EAGER, waits_for_stage=False, acked_by_stage=False, plans_stage=False
        ),
    ]
    assert join_target(lacking) is None
    assert join_target([*lacking, pending(9, waits=False, acked=False)]) == 9
    # one that lacks it after the candidate blocks the candidate too
    assert join_target([pending(6, waits=True, acked=False), lacking[0]]) is None
