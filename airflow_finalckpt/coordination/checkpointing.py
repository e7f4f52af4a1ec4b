"""The checkpoint steps the coordinator's transitions share (trigger, acknowledge, complete,
abort, expire, retention): each reads rows through the locked transition, asks the pure rules
of ``core.transitions`` and writes the outcome. After-commit work (metrics, discarding files)
is queued on the transition, never run inside it.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial, wraps
from typing import ParamSpec, TypeVar

from airflow_finalckpt.core import failure, observe
from airflow_finalckpt.core import transitions as rules
from airflow_finalckpt.core import transitions_eager as eager_rules
from airflow_finalckpt.core import transitions_stop as stop_rules
from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.metadata.codec import encoded_finished
from airflow_finalckpt.core.metadata.writer import CheckpointWriter
from airflow_finalckpt.core.model import (
    CheckpointKind,
    StageLifecycle,
    StageSnapshot,
    StopState,
    TriggerReason,
)
from airflow_finalckpt.core.plan import plan_of_lifecycles
from airflow_finalckpt.core.transitions_boundary import BoundaryAcks
from airflow_finalckpt.core.transitions_eager import FinishJoin
from airflow_finalckpt.core.views import AckOutcome, AckTarget, draining, gone_among, timed_out
from airflow_finalckpt.store.repository import CoordinationStore
from airflow_finalckpt.store.writes import StoreWriter

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a trigger or a completion builds its
    O(stages) values: tens of thousands of short-lived objects, which set off full collections
    that walk every object of the process (the stage task's whole heap: 0.15 s of a 10,000
    stage completion here, more in a worker holding Airflow and PySpark). Reference counting
    still frees them at once; the collector resumes afterwards. A no-op if it is off already
    (nested, or paused by the process).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _collector_paused(step: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``step`` with the collector paused (``collection_paused``)."""

    @wraps(step)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with collection_paused():
            return step(*args, **kwargs)

    return paused


@dataclass
class Tx:
    """One locked transition: its rows and the hooks to run once it committed."""

    rows: StoreWriter
    after_commit: list[Callable[[], None]] = field(default_factory=list)


class Checkpointing:
    """The checkpoint steps of one pipeline, inside transitions the facade opens."""

    def __init__(
        self,
        store: CoordinationStore,
        writer: CheckpointWriter | None,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.key = store.pipeline_key
        self.writer = writer
        self.clock = clock
        #: The parsed graph shape of the last fingerprint seen (the graph JSON is only read
        #: when the fingerprint changes, not in every transition).
        self._shape_cache: tuple[str, StageGraph] | None = None

    def shape(self, tx: Tx) -> StageGraph:
        """The graph's shape, parsed once per fingerprint: the fingerprint hashes exactly that
        shape, so a cached graph with the same fingerprint plans the same checkpoints.
        """
        fingerprint = tx.rows.fingerprint
        cached = self._shape_cache
        if cached is None or cached[0] != fingerprint:
            cached = (fingerprint, StageGraph.from_dict(tx.rows.graph_data()))
            self._shape_cache = cached
        return cached[1]

    # ------------------------------------------------------------------ trigger

    @_collector_paused
    def trigger(self, tx: Tx, kind: CheckpointKind, reason: TriggerReason) -> int:
        """Plan and insert a checkpoint; one with nothing to acknowledge completes at once."""
        graph = self.shape(tx)
        # Lifecycles of every stage and which unfinished ones hold finished splits: a finished
        # stage is a flag in the plan, no progress JSON is read here.
        lifecycles, with_splits = tx.rows.plan_lifecycles()
        plan = plan_of_lifecycles(graph, lifecycles, with_splits)
        checkpoint_id = tx.rows.allocate_id(self.clock())
        tx.rows.insert_checkpoint(checkpoint_id, kind, reason, plan, self.clock())
        tx.rows.stamp_stages_transactions(rules.finished_unclosed(plan, lifecycles), checkpoint_id)
        if not plan.to_ack:
            self.complete(tx, checkpoint_id)
        else:
            self.answer_for_gone(tx)
        return checkpoint_id

    def eager_kind(self, tx: Tx, finishing: str | None = None) -> CheckpointKind | None:
        """What finishing would trigger now (see ``transitions_stop.eager_kind``);
        ``finishing``: a stage counted as finished already (its row is written later).
        """
        stop = tx.rows.latest_stop()
        lifecycles = tx.rows.lifecycles() if draining(stop) else {}
        if finishing is not None and lifecycles:
            lifecycles[finishing] = StageLifecycle.FINISHED
        return stop_rules.eager_kind(stop, list(lifecycles.values()))

    def finish_join(self, tx: Tx, stage_id: str) -> FinishJoin | None:
        """The pending eager checkpoint a finishing stage joins instead of triggering its own
        (``transitions_eager``), None if it triggers one.
        """
        may_join = self.eager_kind(tx, stage_id) is CheckpointKind.CHECKPOINT
        return eager_rules.finish_acks(tx.rows.pending_for_finish(stage_id), may_join)

    def answer_finish(self, tx: Tx, stage_id: str, epoch: int, join: FinishJoin | None) -> None:
        """A finish acknowledges, with its final snapshot, every pending checkpoint that waits
        for the stage, and the ones it joins.
        """
        if join is None:
            for cid in tx.rows.awaiting(stage_id):
                self.ack(tx, cid, stage_id, epoch, by_finish=True)
            return
        for cid in join.by_finish:
            self.ack(tx, cid, stage_id, epoch, by_finish=True, joins=cid in join.joined)

    def eager_trigger(self, tx: Tx) -> int | None:
        """What finishing triggers (see ``transitions_stop.eager_kind``)."""
        kind = self.eager_kind(tx)
        stop = tx.rows.latest_stop()
        if kind is None:
            return None
        if kind is CheckpointKind.DRAINED_SAVEPOINT:
            assert stop is not None
            return self.trigger_for_stop(tx, stop.request_id, kind)
        return self.trigger(tx, CheckpointKind.CHECKPOINT, TriggerReason.EAGER_FINAL)

    def trigger_for_stop(self, tx: Tx, request_id: int, kind: CheckpointKind) -> int:
        """A stop's savepoint: its id is set on the stop before the trigger, so a completion
        within the trigger finds the stop.
        """
        next_id = tx.rows.next_checkpoint_id()
        tx.rows.update_stop(request_id, savepoint_id=next_id)
        if stop_rules.completed_at_once(tx.rows.checkpoint_state(next_id)):
            tx.rows.update_stop(request_id, state=StopState.COMPLETED, finished_at=self.clock())
        cid = self.trigger(tx, kind, stop_rules.savepoint_reason(kind))
        assert cid == next_id
        return cid

    # ------------------------------------------------------------------ acknowledge

    def ack(
        self,
        tx: Tx,
        checkpoint_id: int,
        stage_id: str,
        epoch: int,
        *,
        by_finish: bool,
        joins: bool = False,
        progress: StageSnapshot | None = None,
        target: AckTarget | None = None,
    ) -> AckOutcome:
        """Record the stage's acknowledgement; the last one completes the checkpoint. ``joins``:
        a finish joins a checkpoint that did not wait for the stage (``transitions_eager``): its
        final snapshot is recorded, the count of pending acknowledgements stays. ``progress``:
        the stage's durable progress if the caller just wrote it, ``target``: the checkpoint's
        gate if the caller just read it (else each is read).
        """
        if target is None:
            target = tx.rows.ack_target(checkpoint_id, stage_id)
        gate = rules.ack_gate(checkpoint_id, stage_id, target, joins=joins)
        if gate is not None:
            return gate
        stamps = rules.stamps_on_ack(checkpoint_id, target.newest_acked)
        uncommitted = tx.rows.stamp_and_read_uncommitted(
            stage_id, checkpoint_id if stamps else None
        )
        if progress is None:
            progress = tx.rows.stage_row(stage_id).progress
        snapshot = rules.ack_snapshot(progress, uncommitted)
        acked_at = self.clock()
        remaining = target.acks_pending - 1 if target.due else None
        tx.rows.record_ack(
            checkpoint_id, stage_id, epoch, by_finish, snapshot, acked_at, remaining=remaining
        )
        if remaining is None:  # joined: nobody waited for it
            return AckOutcome.ACCEPTED
        event = observe.CheckpointAcknowledged(
            self.key,
            checkpoint_id,
            stage_id,
            acked_at - target.triggered_at,
            by_finish,
            remaining == 0,
        )
        tx.after_commit.append(partial(observe.notify, event))
        if remaining == 0 and self.complete(tx, checkpoint_id):
            return AckOutcome.COMPLETED
        return AckOutcome.ACCEPTED

    def ack_awaiting(
        self, tx: Tx, stage_id: str, epoch: int, progress: StageSnapshot | None
    ) -> tuple[list[int], list[int]]:
        """A batch boundary answers every pending checkpoint that waits for the stage, oldest
        first, with its durable ``progress``; returns (acknowledged, completed) ids.

        The gates of all of them are read in one statement. Acknowledging in ascending order
        never changes a later one's gate (its newest acknowledged id stays below it); a
        completion may abort or discard other checkpoints, so after one the rest are read
        again.
        """
        acked: list[int] = []
        completed: list[int] = []
        for cid, target in tx.rows.awaiting_targets(stage_id):
            outcome = self.ack(
                tx,
                cid,
                stage_id,
                epoch,
                by_finish=False,
                progress=progress,
                target=None if completed else target,
            )
            if outcome in (AckOutcome.ACCEPTED, AckOutcome.COMPLETED):
                acked.append(cid)
            if outcome is AckOutcome.COMPLETED:
                completed.append(cid)
        return acked, completed

    def notify_boundary_acks(
        self, tx: Tx, stage_id: str, decided: BoundaryAcks, acked_at: float
    ) -> tuple[int, ...]:
        """The events of the acknowledgements a boundary wrote at once (``decide_boundary``:
        none completed its checkpoint); returns their ids, oldest first.
        """
        for ack in decided.acked:
            event = observe.CheckpointAcknowledged(
                self.key,
                ack.checkpoint_id,
                stage_id,
                acked_at - ack.triggered_at,
                False,
                False,
            )
            tx.after_commit.append(partial(observe.notify, event))
        return tuple(ack.checkpoint_id for ack in decided.acked)

    def answer_for_gone(self, tx: Tx) -> tuple[str, ...]:
        """Answer every pending checkpoint that waits for a stage whose attempt is gone
        (``core.plan.attempts_gone``: it failed, or its lease expired) with the stage's durable
        progress, as its last batch boundary would have: a stage that is not running never
        holds a checkpoint hostage. Returns those stages.
        """
        leases = tx.rows.awaited_leases()
        gone = gone_among(leases, self.clock()) if leases else ()
        for stage_id in gone:
            epoch = leases[stage_id][1]
            answered = [
                cid
                for cid in tx.rows.awaiting(stage_id)
                if self.ack(tx, cid, stage_id, epoch, by_finish=False)
                in (AckOutcome.ACCEPTED, AckOutcome.COMPLETED)
            ]
            log.info(
                "pipeline %r: the attempt (epoch %d) of stage %r is gone (failed or its lease "
                "expired): checkpoints %s recorded it from its last durable batch boundary",
                self.key,
                epoch,
                stage_id,
                answered,
            )
        return gone

    # ------------------------------------------------------------------ abort and expire

    def abort(self, tx: Tx, checkpoint_id: int, kind: CheckpointFailureReason, detail: str) -> None:
        """ABORTED; a stop waiting for this savepoint fails (the run goes on)."""
        tx.rows.mark_aborted(checkpoint_id, kind, detail)
        event = observe.CheckpointAborted(self.key, checkpoint_id, detail)
        tx.after_commit.append(partial(observe.notify, event))
        stop = rules.stop_settled_by(tx.rows.latest_stop(), checkpoint_id)
        if stop is not None:
            tx.rows.update_stop(
                stop.request_id,
                state=StopState.FAILED,
                finished_at=self.clock(),
                failure_reason=failure.savepoint_aborted(checkpoint_id, detail),
            )

    def expire(self, tx: Tx) -> list[int]:
        """Answer for stages whose attempt is gone (``answer_for_gone``), then abort pending
        checkpoints older than the checkpoint timeout.
        """
        self.answer_for_gone(tx)
        timeout_s = tx.rows.timeout_s
        expired = timed_out(tx.rows.pending(), self.clock(), timeout_s)
        for cid in expired:
            self.abort(tx, cid, CheckpointFailureReason.EXPIRED, failure.expired(timeout_s))
        return expired

    # ------------------------------------------------------------------ complete

    @_collector_paused
    def complete(self, tx: Tx, checkpoint_id: int) -> bool:
        """Complete a fully acknowledged checkpoint; False if it was aborted instead (its
        metadata write failed, or a stage it records from restored progress started work
        since the trigger).
        """
        info = tx.rows.checkpoint(checkpoint_id)
        acks = tx.rows.acks(checkpoint_id)
        unstarted = tx.rows.unstarted_progress()
        moved = rules.started_since_trigger(info.plan, acks, unstarted)
        if moved:
            detail = (
                f"stage(s) {', '.join(map(repr, moved))} started work after the checkpoint was "
                "triggered, so their restored progress at the trigger is gone; the next "
                "checkpoint asks them"
            )
            self.abort(tx, checkpoint_id, CheckpointFailureReason.DECLINED, detail)
            return False
        # Reads only what the record holds: of finished stages their end (never their finished
        # split ids) and the entry each was encoded as when it finished, progress only of
        # stages that have not started work, transactions in one query.
        finished = tx.rows.finished_stages()
        record = rules.build_record(
            self.key,
            info,
            acks,
            finished.ends,
            unstarted,
            tx.rows.uncommitted_of(
                rules.needs_transactions(info.plan, acks), unacked=checkpoint_id
            ),
            tx.rows.graph_data(),
            tx.rows.fingerprint,
            self.clock(),
            built=finished.records,
        )
        path: str | None = None
        size: int | None = None
        if self.writer is not None:
            try:
                # The id was never completed (this transition holds the pipeline lock), so a
                # chk-<id> directory already there is a leftover of a completion that failed or
                # was rolled back by a crash (the id was allocated again): replace it.
                with encoded_finished(rules.pre_encoded(record, acks, finished.entries)):
                    path, size = self.writer.write_checkpoint(record, replace_orphan=True)
            except Exception as exc:  # storage failed: the checkpoint fails, the run goes on
                self.abort(
                    tx,
                    checkpoint_id,
                    CheckpointFailureReason.WRITE_FAILED,
                    failure.write_failed(exc),
                )
                # What the failed write left (a complete-looking _metadata if the error came
                # after the rename, an empty directory) goes once the abort committed.
                tx.after_commit.append(partial(self.discard_leftover, checkpoint_id))
                return False
        now = self.clock()
        tx.rows.mark_completed(checkpoint_id, now, path, size)
        completed = observe.CheckpointCompleted(
            self.key,
            checkpoint_id,
            record.kind.value,
            record.reason.value,
            now - record.triggered_at,
            size,
            sum(h.size for stage in record.stages.values() for h in stage.state),
            len(record.stages),
        )
        tx.after_commit.append(partial(observe.notify, completed))
        for cid in rules.subsumed_by(checkpoint_id, tx.rows.pending_kinds()):
            self.abort(tx, cid, CheckpointFailureReason.SUBSUMED, failure.subsumed(checkpoint_id))
        self.apply_retention(tx)
        stop = rules.stop_settled_by(tx.rows.latest_stop(), checkpoint_id)
        if stop is not None:
            tx.rows.update_stop(stop.request_id, state=StopState.COMPLETED, finished_at=now)
        return True

    def apply_retention(self, tx: Tx) -> None:
        """Discard completed checkpoints beyond retention (their files after commit)."""
        for cid, path in rules.beyond_retention(tx.rows.completed_checkpoints(), tx.rows.retain):
            tx.rows.mark_discarded(cid)
            if path and self.writer is not None:
                tx.after_commit.append(partial(self.writer.discard_checkpoint, path))
        if self.writer is not None:
            # Every retention pass also finishes earlier discards that a crash or an I/O error
            # interrupted (nothing else would ever retry them).
            tx.after_commit.append(self.sweep_leftover_checkpoints)

    # ------------------------------------------------------------------ after commit

    def discard_leftover(self, checkpoint_id: int) -> None:
        """After commit: delete ``chk-<id>`` of a checkpoint that did not complete."""
        discard = getattr(self.writer, "discard_checkpoint_dir", None)
        if discard is not None:
            discard(self.key, checkpoint_id)

    def sweep_leftover_checkpoints(self) -> None:
        """After commit: delete the directories of ABORTED and DISCARDED checkpoints that
        checkpoint storage still holds (an interrupted discard, a failed completion).

        Both states are final, so no transition can need those files again; the states are read
        after the commit, outside the lock, and a PENDING checkpoint being written concurrently
        is never touched. Best effort: a failure is logged and retried at the next pass.
        """
        list_ids = getattr(self.writer, "checkpoint_dir_ids", None)
        discard = getattr(self.writer, "discard_checkpoint_dir", None)
        if list_ids is None or discard is None:
            return
        on_disk = list_ids(self.key)
        if not on_disk:
            return
        with self.store.read() as rows:
            gone = rows.final_among(on_disk)
        for cid in gone:
            try:
                discard(self.key, cid)
            except Exception:
                log.warning(
                    "pipeline %r: cannot delete the directory of checkpoint %d (retried at the "
                    "next retention pass)",
                    self.key,
                    cid,
                    exc_info=True,
                )
            else:
                log.info(
                    "pipeline %r: deleted the leftover directory of checkpoint %d", self.key, cid
                )
