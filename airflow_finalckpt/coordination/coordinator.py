"""The checkpoint coordinator: FLIP-147's CheckpointCoordinator over the coordination store.

A thin facade: every public method that changes state is one *transition*, one database
transaction that first locks the pipeline row (``store.repository``), so any number of processes
(Airflow workers, the triggerer, Spark drivers, the API server) can drive one pipeline without
lost or doubled transitions. Inside it the rows are read, the pure rules decide
(``core.transitions``, ``core.transitions_stage``, ``core.transitions_stop``) and the outcome is
written; after-commit hooks (metrics, discarding files) run once it committed.

The rules it enforces (docs/protocol.md):

- a checkpoint's plan is computed atomically from the stages' live state; running stages answer
  at their next split-batch boundary (``record_batch``) or explicitly (``acknowledge``);
- a stage that finishes while a checkpoint waits for it acknowledges it with its final snapshot
  (never a hanging checkpoint), and finishing triggers an eager checkpoint at once;
- a finished stage may close on the first *completed* checkpoint whose id is >= the first
  checkpoint triggered after its finish (completions may arrive out of order: 42, 43, 44 pending,
  43 completes -> close on 43); while a stop-with-savepoint is in progress it waits for that
  exact savepoint, and if the savepoint is aborted the stop fails and the run goes on;
- every stage attempt holds an epoch; calls from a stale epoch raise StaleEpochError;
- a transaction is committable only once a completed checkpoint covers it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine

from airflow_finalckpt.coordination.checkpointing import Checkpointing, Tx
from airflow_finalckpt.coordination.queries import CoordinatorReads
from airflow_finalckpt.coordination.restoring import apply_restore, check_start, claim_drive
from airflow_finalckpt.core import failure
from airflow_finalckpt.core import transitions as rules
from airflow_finalckpt.core import transitions_boundary as boundary_rules
from airflow_finalckpt.core import transitions_stage as stage_rules
from airflow_finalckpt.core import transitions_stop as stop_rules
from airflow_finalckpt.core.errors import CheckpointNotPendingError
from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.metadata.writer import CheckpointWriter
from airflow_finalckpt.core.model import (
    CheckpointKind,
    CheckpointRecord,
    CheckpointState,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    StateHandle,
    StopMode,
    StopState,
    TransactionState,
    TriggerReason,
)
from airflow_finalckpt.core.rerun import Publication, TaskTry
from airflow_finalckpt.core.restore import RestorePlan
from airflow_finalckpt.core.run_instance import KeyChoice, RunInstance
from airflow_finalckpt.core.views import (
    AckOutcome,
    BatchOutcome,
    CoordinatorOptions,
    FinishOutcome,
    StageChange,
    StageView,
    StartOutcome,
    StopRequest,
    gone_among,
    needs_final_checkpoint,
    suspends,
    timed_out,
)
from airflow_finalckpt.store.cursors import settle_ranges
from airflow_finalckpt.store.reads import StoreReader
from airflow_finalckpt.store.repository import CoordinationStore

log = logging.getLogger(__name__)


class Coordinator(CoordinatorReads):
    """Coordinates the checkpoints of one pipeline (identified by its pipeline key)."""

    def __init__(
        self,
        engine: Engine,
        pipeline_key: str,
        *,
        writer: CheckpointWriter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.pipeline_key = pipeline_key
        # checkpoint storage; ``discard_checkpoint_dir`` / ``checkpoint_dir_ids`` are used only if
        # the writer has them (finishing interrupted discards, removing aborted leftovers)
        self.writer = writer
        self.clock = clock
        self.store = CoordinationStore(engine, pipeline_key)
        self._ops = Checkpointing(self.store, writer, clock)

    # ------------------------------------------------------------------ transactions

    @contextmanager
    def _transition(
        self,
        *,
        create: Mapping[str, Any] | None = None,
        boundary: tuple[str, Sequence[SinkTransaction]] | None = None,
    ) -> Iterator[Tx]:
        """One locked transition; its after-commit hooks run once it committed."""
        hooks: list[Callable[[], None]] = []
        with self.store.transition(create=create, boundary=boundary) as rows:
            yield Tx(rows, hooks)
        for hook in hooks:
            try:
                hook()
            except Exception:  # the transition committed; a failed cleanup must not undo it
                log.warning(
                    "after-commit hook of pipeline %r failed", self.pipeline_key, exc_info=True
                )

    # ------------------------------------------------------------------ registration

    def register(self, graph: StageGraph, options: CoordinatorOptions | None = None) -> None:
        """Create the pipeline (idempotent) or move it to a changed graph, refusing (before any
        write) a change that would lose progress: see :meth:`start_pipeline`.
        """
        self.start_pipeline(graph, options=options)

    def start_pipeline(
        self,
        graph: StageGraph,
        *,
        options: CoordinatorOptions | None = None,
        record: CheckpointRecord | None = None,
        source: str | None = None,
        allow_drop_stages: Collection[str] = (),
        driver: tuple[str, str] | None = None,
        take_over: bool = False,
    ) -> StartOutcome:
        """Start (or continue) the pipeline on ``graph``: the one entry every stage attempt
        goes through, so every start from existing progress runs the same graph-change check.

        In one transaction holding the pipeline lock, *before anything is written*:

        * ``record`` not yet restored from ``source`` (``restore_from``): the checkpoint's graph
          and statuses are checked against ``graph`` (:func:`plan_restore`), then every stage is
          reset to it;
        * otherwise, a stored graph whose fingerprint differs from ``graph``'s (a
          ``pipeline_key`` continuation or a retry after the DAG changed): the stored progress
          is checked (:func:`plan_graph_change`); stages it removes lose their rows only if they
          never started or are named in ``allow_drop_stages``;
        * the same fingerprint (a retry of the unchanged DAG, the run's other tasks): no check.

        ``driver``: the (dag_id, run_id) starting the attempt: another DAG run that still drives
        the pipeline refuses it unless ``take_over`` (``core.driving``).

        Raises PipelineDrivenError / IllegalGraphChangeError / DrainedSavepointError /
        ForeignCheckpointError / MetadataError with the store unchanged (a new pipeline is not
        even created).
        """
        opts = options or CoordinatorOptions()
        now = self.clock()
        create = {
            "pipeline_key": self.pipeline_key,
            "graph": graph.to_dict(),
            "fingerprint": graph.fingerprint,
            "next_checkpoint_id": 1,
            "retain_checkpoints": opts.retain_checkpoints,
            "checkpoint_timeout_s": opts.checkpoint_timeout_s,
            "created_at": now,
            "updated_at": now,
        }
        with self._transition(create=create) as tx:
            drives = driver is not None and claim_drive(tx, driver, take_over=take_over, now=now)
            plan, change = check_start(tx, graph, record, source, allow_drop_stages)
            # every check passed: from here on the transaction writes
            if drives and driver is not None:
                tx.rows.set_driver(*driver)
            tx.rows.write_graph(graph, opts, now)
            if plan is not None and record is not None:
                apply_restore(self._ops, tx, plan, record, str(source), now)
            outcome = StartOutcome(restored=plan, change=change)
        if record is not None and source is not None:
            # Every start from a savepoint (each stage task, each attempt), not only the one
            # that applied the restore: no stage reads before the files are in place.
            self._materialize(record, source)
        return outcome

    def _materialize(self, record: CheckpointRecord, source: str) -> None:
        """Copy the files a self-contained savepoint holds into this pipeline's directory
        where they are missing (a savepoint directory copied alone to another cluster).
        """
        materialize = getattr(self.writer, "materialize", None)
        if materialize is not None:
            materialize(record, source)

    def link_dag_run(
        self,
        dag_id: str,
        run_id: str,
        choice: KeyChoice | None = None,
        *,
        instance: RunInstance | None = None,
    ) -> None:
        """Record that an Airflow DAG run works on this pipeline (idempotent). A DAG run belongs
        to one pipeline: linking it to another one is refused. ``instance``: its DAG run
        instance (``core.run_instance``); ``choice``: how its default key was chosen (a
        re-created run's link moves here from the pipeline it replaces).
        """
        self.store.link_dag_run(
            dag_id,
            run_id,
            self.clock(),
            instance=instance,
            generation=1 if choice is None else choice.generation,
            replaces=None if choice is None else choice.replaces,
        )

    # ------------------------------------------------------------------ stage attempts

    def start_attempt(
        self,
        stage_id: str,
        *,
        total_splits: int | None = None,
        split_list_sha256: str | None = None,
    ) -> StageView:
        """Register a new attempt of a stage and return its view with the new epoch.

        The new attempt continues from the stage's durable progress; older attempts are fenced.
        A finished stage stays finished (the new attempt only waits for its final checkpoint).
        While a stop with savepoint is in progress or done, a stage that has not started work
        begins suspended and waits for the resume.
        """
        with self._transition() as tx:
            row = tx.rows.stage_row(stage_id)
            suspended = False
            if stage_rules.starts_work(row.lifecycle):
                suspended = suspends(tx.rows.latest_stop()) and not tx.rows.awaiting(stage_id)
            change = stage_rules.start_attempt(
                row,
                suspended=suspended,
                total_splits=total_splits,
                split_list_sha256=split_list_sha256,
            )
            tx.rows.update_stage(stage_id, change, self.clock())
            return tx.rows.stage_row(stage_id).view()

    def renew_lease(self, stage_id: str, epoch: int, lease_s: float) -> bool:
        """The running attempt ``epoch`` is alive for ``lease_s`` more seconds (its heartbeat,
        see ``core.plan.attempt_gone``); False if it is not the stage's running attempt any more.
        No pipeline lock: one row, in its own short transaction.
        """
        return self.store.renew_lease(stage_id, epoch, self.clock() + lease_s)

    def release_attempt(self, stage_id: str, epoch: int) -> tuple[str, ...]:
        """The attempt ``epoch`` failed (its task's failure path, before the error propagates):
        its lease ends now and the pending checkpoints that wait for it are answered from its
        durable progress in the same transition, so a sibling's final checkpoint completes at
        once. A no-op for a stale or not RUNNING attempt. Returns the stages answered for.
        """
        with self._transition() as tx:
            if not tx.rows.set_lease(stage_id, epoch, 0.0):
                return ()
            return self._ops.answer_for_gone(tx)

    # ------------------------------------------------------------------ checkpoints

    def trigger(
        self,
        reason: TriggerReason = TriggerReason.PERIODIC,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    ) -> int | None:
        """Trigger a checkpoint; None if none is due (periodic while one is pending, or the
        run is stopping with a savepoint / suspended / drained).
        """
        with self._transition() as tx:
            self._ops.expire(tx)
            stop = tx.rows.latest_stop()
            has_pending = reason is TriggerReason.PERIODIC and bool(tx.rows.pending_ids())
            if not rules.may_trigger(reason, stop, has_pending):
                return None
            return self._ops.trigger(tx, kind, reason)

    def acknowledge(
        self,
        checkpoint_id: int,
        stage_id: str,
        epoch: int,
        snapshot: StageSnapshot | None = None,
    ) -> AckOutcome:
        """Acknowledge a checkpoint with the stage's snapshot (default: its durable progress)."""
        with self._transition() as tx:
            row = tx.rows.stage_row(stage_id)
            stage_rules.fence(row, epoch)
            if snapshot is not None:
                merged = rules.merge_progress(row.progress, snapshot)
                now = self.clock()
                tx.rows.update_stage(stage_id, StageChange(progress=merged), now)
                tx.rows.record_transactions(stage_id, epoch, snapshot.pending_transactions, now)
            return self._ops.ack(tx, checkpoint_id, stage_id, epoch, by_finish=False)

    def record_batch(
        self,
        stage_id: str,
        epoch: int,
        *,
        finished_splits: Iterable[str] = (),
        state: Sequence[StateHandle] | None = None,
        transactions: Sequence[SinkTransaction] = (),
        watermark: int | None = None,
    ) -> BatchOutcome:
        """A split-batch boundary: make the batch's progress durable and answer every pending
        checkpoint that waits for this stage, in one transition.
        """
        with self._transition(boundary=(stage_id, transactions)) as tx:
            # One read of the row, the stop (kept for the outcome) and what the answers decide on.
            row, read = tx.rows.boundary(stage_id, transactions)
            stage_rules.fence(row, epoch)
            delta = StageSnapshot(
                finished_splits=frozenset(finished_splits),
                state=tuple(state) if state is not None else (),
                watermark=watermark,
            )
            change = stage_rules.record_batch(row, delta, replace_state=state is not None)
            now = self.clock()
            decided = boundary_rules.decide_boundary(
                read.awaiting, read.newest_acked, read.stored, transactions
            )
            if decided is not None:  # one write; no answer completes its checkpoint
                snapshot = None
                if decided.acked and change.progress is not None:
                    snapshot = rules.ack_snapshot(change.progress, decided.uncommitted)
                tx.rows.write_boundary(stage_id, epoch, change, decided, snapshot, now)
                acked = self._ops.notify_boundary_acks(tx, stage_id, decided, now)
                return BatchOutcome(acked, (), tx.rows.latest_stop())
            tx.rows.update_stage(stage_id, change, now)
            tx.rows.record_transactions(stage_id, epoch, transactions, now)
            acked_ids, completed = self._ops.ack_awaiting(tx, stage_id, epoch, change.progress)
            return BatchOutcome(tuple(acked_ids), tuple(completed), tx.rows.latest_stop())

    def decline(self, checkpoint_id: int, stage_id: str, epoch: int, reason: str) -> None:
        """A stage cannot take part in a checkpoint: abort it."""
        with self._transition() as tx:
            stage_rules.fence(tx.rows.stage_row(stage_id), epoch)
            state = tx.rows.checkpoint(checkpoint_id).state
            if state is not CheckpointState.PENDING:
                raise CheckpointNotPendingError(
                    f"checkpoint {checkpoint_id} is {state}, it cannot be declined"
                )
            detail = failure.declined(stage_id, reason)
            self._ops.abort(tx, checkpoint_id, CheckpointFailureReason.DECLINED, detail)

    def abort(
        self,
        checkpoint_id: int,
        reason: str,
        *,
        kind: CheckpointFailureReason = CheckpointFailureReason.MANUAL,
    ) -> bool:
        """Abort a pending checkpoint; False if it was no longer pending."""
        with self._transition() as tx:
            if tx.rows.checkpoint(checkpoint_id).state is not CheckpointState.PENDING:
                return False
            self._ops.abort(tx, checkpoint_id, kind, reason)
            return True

    def expire_timed_out(self) -> list[int]:
        """Abort pending checkpoints older than the pipeline's checkpoint timeout."""
        with self._transition() as tx:
            return self._ops.expire(tx)

    # ------------------------------------------------------------------ finishing and closing

    def finish(self, stage_id: str, epoch: int, snapshot: StageSnapshot) -> FinishOutcome:
        """endInput() + finish(): record the final snapshot, acknowledge checkpoints waiting for
        the stage with it, and trigger the eager final checkpoint. Idempotent per attempt.
        """
        with self._transition() as tx:
            row = tx.rows.stage_row(stage_id)
            stage_rules.fence(row, epoch)
            done = stage_rules.already_finished(row)
            if done is not None:
                return done
            # Coalescing: an eager checkpoint in flight that can still take the final snapshot
            # is joined (its id is the threshold) instead of triggering one more.
            join = self._ops.finish_join(tx, stage_id)
            threshold = tx.rows.next_checkpoint_id() if join is None else join.threshold
            change, eod = stage_rules.finish(row, snapshot, threshold)
            now = self.clock()
            tx.rows.record_transactions(stage_id, epoch, snapshot.pending_transactions, now)
            tx.rows.update_stage(stage_id, change, now)
            self._ops.answer_finish(tx, stage_id, epoch, join)
            eager = self._ops.eager_trigger(tx) if join is None else join.threshold
            return FinishOutcome(threshold, eager, eod, joined=join is not None)

    def ensure_final_checkpoint(self, stage_id: str) -> int | None:
        """Make sure a finished stage has a checkpoint in flight that can close it.

        Called by whoever waits for the stage (its deferred trigger) on every poll, so a final
        checkpoint that was aborted (timeout, storage failure, failed savepoint) is replaced at
        once instead of waiting for the next periodic one. Returns the triggered id, if any.

        Read-only fast path: almost always a candidate is in flight and nothing timed out, so
        the write transition (the pipeline lock every other transition waits for) is taken
        only when a read shows it would change something; under the lock everything is
        checked again.
        """
        with self.store.read() as rows:
            if not self._final_checkpoint_work(rows, stage_id, expire=True):
                return None
        with self._transition() as tx:
            self._ops.expire(tx)
            if not self._final_checkpoint_work(tx.rows, stage_id, expire=False):
                return None
            return self._ops.eager_trigger(tx)

    def _final_checkpoint_work(self, rows: StoreReader, stage_id: str, *, expire: bool) -> bool:
        """Does ``ensure_final_checkpoint`` have anything to do: (``expire``) a pending
        checkpoint to time out or to answer for a stage whose attempt is gone, or a FINISHED
        stage without a checkpoint in flight or completed that can close it (and no stop with
        savepoint it must wait for)?
        """
        if expire and timed_out(rows.pending(), self.clock(), rows.checkpoint_timeout()):
            return True
        if expire and gone_among(rows.awaited_leases(), self.clock()):
            return True  # answered for from their durable progress (``Checkpointing.expire``)
        lifecycle, threshold = rows.stage_finish_state(stage_id)
        if lifecycle is not StageLifecycle.FINISHED:
            return False
        stop = rows.latest_stop()
        if suspends(stop):  # it waits for that exact savepoint
            return False
        return needs_final_checkpoint(
            lifecycle, stop, has_candidate=rows.has_candidate_from(int(threshold or 0))
        )

    def mark_committed(self, stage_id: str, epoch: int, sink_id: str, txn_id: str) -> bool:
        """Record that the sink committed a transaction. False if it already was (no-op).

        Fenced: a stale attempt cannot record commits; a transaction not yet covered by a
        completed checkpoint cannot be committed.
        """
        with self._transition() as tx:
            stage_rules.fence(tx.rows.stage_row(stage_id), epoch)
            txn = tx.rows.transaction(stage_id, sink_id, txn_id)
            if not stage_rules.may_commit(txn, tx.rows.latest_completed_id()):
                return False
            tx.rows.set_transaction_state(
                stage_id, sink_id, txn_id, TransactionState.COMMITTED, self.clock()
            )
            return True

    def close(self, stage_id: str, epoch: int, checkpoint_id: int) -> list[SinkTransaction]:
        """close(): the stage's transactions up to ``checkpoint_id`` are committed; later ones
        are aborted (returned, so the caller aborts them in the sink); the stage is CLOSED.
        """
        with self._transition() as tx:
            row = tx.rows.stage_row(stage_id)
            stage_rules.fence(row, epoch)
            if not stage_rules.close_gate(row, tx.rows.latest_stop()):
                return []
            completed = tx.rows.checkpoint(checkpoint_id).is_completed
            uncommitted = tx.rows.uncommitted(stage_id)
            change = stage_rules.close(row, checkpoint_id, completed, uncommitted)
            now = self.clock()
            for txn in uncommitted:
                tx.rows.set_transaction_state(
                    stage_id, txn.sink_id, txn.txn_id, TransactionState.ABORTED, now
                )
            tx.rows.update_stage(stage_id, change, now)
            # the pipeline's last close advances its sources' cursors, in this transaction
            settle_ranges(
                tx.rows.conn, self.pipeline_key, tx.rows.lifecycles(), tx.rows.stage_row, now
            )
            if self.writer is not None:
                # A discard interrupted at the last completion would otherwise stay forever.
                tx.after_commit.append(self._ops.sweep_leftover_checkpoints)
            return uncommitted

    def reset_stage(self, stage_id: str) -> StageView:
        """Forget a stage's progress so it recomputes (a cleared, committed stage on purpose).

        The epoch is bumped (fencing any running attempt); committed output stays committed.
        """
        return self.reset_stages([stage_id])[stage_id]

    def reset_stages(self, stage_ids: Sequence[str]) -> dict[str, StageView]:
        """Reset several stages in one transition (a stage and the stages downstream of it);
        UnknownStageError, with nothing reset, if one is not part of the pipeline.
        """
        with self._transition() as tx:
            rows = {sid: tx.rows.stage_row(sid) for sid in stage_ids}
            now = self.clock()
            for stage_id, row in rows.items():
                for txn in tx.rows.uncommitted(stage_id):
                    tx.rows.set_transaction_state(
                        stage_id, txn.sink_id, txn.txn_id, TransactionState.ABORTED, now
                    )
                tx.rows.supersede_committed(stage_id, now)
                tx.rows.update_stage(stage_id, stage_rules.reset(row), now)
                tx.rows.forget_published(stage_id)
            return {sid: tx.rows.stage_row(sid).view() for sid in rows}

    def publish(self, stage_id: str, published_by: TaskTry) -> Publication:
        """Record the try that returns the CLOSED stage to Airflow (``core.rerun``): FIRST if
        its success announces the commit, AGAIN if another try returned it before.
        """
        return self.store.publish(stage_id, published_by.to_dict())

    # ------------------------------------------------------------------ restore

    def restore(self, plan: RestorePlan, record: CheckpointRecord, source: str) -> bool:
        """Reset every stage to a checkpoint or savepoint (``plan`` from ``plan_restore``).

        Fully finished stages become FINISHED and closable at once (their pending transactions
        are re-committed idempotently, their end_of_data re-published, no Spark job runs);
        partially finished ones keep their finished splits and state; the others start fresh.
        Works on an empty store too (the checkpoint is imported). Idempotent per ``source``:
        returns False if the pipeline was already restored from it.
        """
        with self._transition() as tx:
            if tx.rows.restored_source == source:
                return False
            apply_restore(self._ops, tx, plan, record, source, self.clock())
        self._materialize(record, source)
        return True

    # ------------------------------------------------------------------ stop and resume

    def request_stop(self, mode: StopMode, requested_by: str | None = None) -> StopRequest:
        """Stop with drain (finish everything, final drained savepoint) or with a savepoint
        (suspend without finishing). Refused while another stop runs or after the run ended.
        """
        with self._transition() as tx:
            self._ops.expire(tx)
            stop = tx.rows.latest_stop()
            lifecycles = list(tx.rows.lifecycles().values())
            stop_rules.check_stop_request(self.pipeline_key, stop, lifecycles)
            request_id = tx.rows.insert_stop(mode, requested_by, self.clock())
            kind = stop_rules.stop_savepoint(mode, lifecycles)
            if kind is not None:
                self._ops.trigger_for_stop(tx, request_id, kind)
            result = tx.rows.latest_stop()
            assert result is not None
            return result

    def suspend(self, stage_id: str, epoch: int) -> None:
        """A running stage stopped at a batch boundary for a savepoint (no finish())."""
        with self._transition() as tx:
            row = tx.rows.stage_row(stage_id)
            stage_rules.fence(row, epoch)
            change = stage_rules.suspend(row, tx.rows.latest_stop())
            if change is not None:
                tx.rows.update_stage(stage_id, change, self.clock())

    def resume(self, requested_by: str | None = None) -> StopRequest:
        """Continue a run suspended by a savepoint."""
        with self._transition() as tx:
            stop = stop_rules.check_resume(self.pipeline_key, tx.rows.latest_stop())
            tx.rows.update_stop(
                stop.request_id,
                state=StopState.RESUMED,
                requested_by=requested_by or stop.requested_by,
            )
            lifecycles = list(tx.rows.lifecycles().values())
            if stop_rules.resume_needs_checkpoint(lifecycles):
                self._ops.trigger(tx, CheckpointKind.CHECKPOINT, TriggerReason.EAGER_FINAL)
            result = tx.rows.latest_stop()
            assert result is not None
            return result
