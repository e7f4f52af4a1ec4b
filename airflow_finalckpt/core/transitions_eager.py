"""Coalesced eager checkpoints: the rule that lets a finishing stage join an eager final
checkpoint already in flight instead of triggering one of its own, as pure functions over
plain values (tests/unit/test_transitions_eager.py).

Why it is safe. A finished stage closes on the first *completed* checkpoint whose id is >= its
threshold, committing the transactions that checkpoint covers. So every checkpoint >= the
threshold must hold the stage's *final* snapshot, never an earlier one. Triggering a new
checkpoint after the finish guarantees that trivially (the old rule: threshold = next id). A
pending checkpoint J guarantees it too, when the stage has not acknowledged J, nor any pending
checkpoint after J, at a batch boundary (and every one of them plans the stage): the finish
then acknowledges every pending checkpoint
from J on with its final snapshot (those that wait for it, as before, and, as a *join*, those
that planned it as not started because it started after they were triggered). Checkpoints
triggered later record it FULLY_FINISHED anyway. Acknowledgements of other stages do not
matter: a running stage has no running upstream or downstream stage (Airflow starts a stage
after its upstream stages closed), so the cut stays consistent.

Why it coalesces. F stages finishing while a sibling runs all join the first eager checkpoint
(each finish acknowledges it with its final snapshot): one pending checkpoint, one ``_metadata``
at the sibling's next batch boundary, instead of F of each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_finalckpt.core.model import CheckpointKind, TriggerReason


@dataclass(frozen=True)
class PendingCheckpoint:
    """A pending checkpoint as a finish of one stage sees it."""

    checkpoint_id: int
    kind: CheckpointKind
    reason: TriggerReason
    #: It waits for the stage's acknowledgement (the stage ran when it was triggered).
    waits_for_stage: bool
    #: The stage acknowledged it already (at a batch boundary, with a pre-finish snapshot).
    acked_by_stage: bool
    #: Its plan records the stage (False: the stage joined the graph after it was triggered,
    #: a changed DAG continuing the pipeline; it can never hold the stage).
    plans_stage: bool = True

    @property
    def cannot_hold_final(self) -> bool:
        """It holds a snapshot of the stage from before the finish, or none at all."""
        return self.acked_by_stage or not self.plans_stage

    @property
    def eager(self) -> bool:
        """An eager final checkpoint (never a savepoint, a periodic or a manual one)."""
        return self.kind is CheckpointKind.CHECKPOINT and self.reason is TriggerReason.EAGER_FINAL


@dataclass(frozen=True)
class FinishJoin:
    """What a finish does with the pending checkpoints when it joins one.

    ``threshold``: the joined checkpoint, the first the stage may close on. ``by_finish``:
    every pending checkpoint the finish acknowledges with the final snapshot, ascending (those
    that wait for the stage, and those from the threshold on that it joins); ``joined``: the
    part of them that did not wait for the stage (their count of pending acknowledgements stays).
    """

    threshold: int
    by_finish: tuple[int, ...]
    joined: tuple[int, ...]


def join_target(pending: Sequence[PendingCheckpoint]) -> int | None:
    """The pending eager checkpoint a finishing stage joins: the oldest one after every pending
    checkpoint that cannot hold its final snapshot (the stage acknowledged it already, or its
    plan does not know the stage); None: trigger a new one.
    """
    blocked = [p.checkpoint_id for p in pending if p.cannot_hold_final]
    after = max(blocked, default=None)
    for p in sorted(pending, key=lambda c: c.checkpoint_id):
        if p.eager and (after is None or p.checkpoint_id > after):
            return p.checkpoint_id
    return None


def finish_acks(pending: Sequence[PendingCheckpoint], may_join: bool) -> FinishJoin | None:
    """How a finish answers the pending checkpoints when it may join one (``may_join``: what
    finishing would trigger is an eager checkpoint, not a drained savepoint or nothing).

    None: no join; the finish acknowledges the checkpoints that wait for it and its threshold is
    the next id (the checkpoint it triggers), as without coalescing.
    """
    target = join_target(pending) if may_join else None
    if target is None:
        return None
    joined = tuple(
        p.checkpoint_id
        for p in pending
        if p.checkpoint_id >= target and not p.waits_for_stage and not p.acked_by_stage
    )
    waiting = tuple(p.checkpoint_id for p in pending if p.waits_for_stage)
    return FinishJoin(target, tuple(sorted({*waiting, *joined})), joined)
