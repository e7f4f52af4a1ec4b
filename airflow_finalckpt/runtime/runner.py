"""The stage runtime: drives one stage attempt through FLIP-147's lifecycle.

RUNNING: pending splits are processed in batches; after each batch its progress (finished
splits, output parts, state, pre-committed sink transactions) is made durable in one coordinator
transition that also answers pending checkpoints, so a crash redoes at most the in-flight batch.
FINISHED (WAITING_FOR_FINAL_CP): endInput() + finish() flushed the state (every window fires),
pre-committed the last transactions, published end_of_data and triggered the eager final
checkpoint. CLOSED: once a qualifying checkpoint completed, covered transactions are committed,
later ones aborted.

The runtime knows neither Airflow nor Spark: a ``StageLogic`` does the work of a batch.
``StageRunner`` is here; the plain values and protocols it works with are in ``values``, batch
sizing and transaction names in ``batches``, the commit and close in ``closer`` (all importable
from this module too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from airflow_finalckpt import metrics
from airflow_finalckpt.core.assignment import remaining_splits
from airflow_finalckpt.core.batching import Throughput
from airflow_finalckpt.core.definition import SinkDecl, sink_clashes
from airflow_finalckpt.core.errors import StageDefinitionError, StaleEpochError
from airflow_finalckpt.core.model import (
    MAX_WATERMARK,
    OUTPUT_PREFIX,
    EndOfData,
    SinkTransaction,
    StageLifecycle,
    StageSnapshot,
    StateHandle,
    TriggerReason,
    output_parts,
)
from airflow_finalckpt.core.partitions import with_partitions
from airflow_finalckpt.core.ports import CoordinatorPort
from airflow_finalckpt.core.split_list import (
    check_finished_split_list,
    check_finished_splits_declared,
    split_list_change,
    split_list_fingerprint,
)
from airflow_finalckpt.core.views import StageView, StopRequest, draining, suspends
from airflow_finalckpt.runtime.batches import (
    BatchSizer,
    batch_key,
    transaction_id,
    transaction_prefix,
)
from airflow_finalckpt.runtime.closer import StageCloser, abort_orphaned_transactions
from airflow_finalckpt.runtime.lease import AttemptLease
from airflow_finalckpt.runtime.plan_gate import PlanGate, next_batch
from airflow_finalckpt.runtime.values import (
    Batch,
    BatchOutput,
    CommitMode,
    Log,
    Progress,
    RunResult,
    RunStatus,
    StageLogic,
    StageSpec,
    ThroughputHints,
)
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink

__all__ = [
    "Batch",
    "BatchOutput",
    "BatchSizer",
    "CommitMode",
    "Log",
    "Progress",
    "RunResult",
    "RunStatus",
    "StageCloser",
    "StageLogic",
    "StageRunner",
    "StageSpec",
    "ThroughputHints",
    "batch_key",
    "transaction_id",
    "transaction_prefix",
]


def _split_state(
    handles: Sequence[StateHandle],
) -> tuple[list[StateHandle], list[StateHandle]]:
    outputs = [h for h in handles if h.name.startswith(OUTPUT_PREFIX)]
    others = [h for h in handles if not h.name.startswith(OUTPUT_PREFIX)]
    return outputs, others


class StageRunner:
    """Runs one attempt of one stage against the coordinator, its sinks and its logic."""

    def __init__(
        self,
        coordinator: CoordinatorPort,
        spec: StageSpec,
        logic: StageLogic,
        sinks: Sequence[TwoPhaseCommitSink] = (),
        *,
        output_handle: Callable[[Batch, Sequence[str]], StateHandle] | None = None,
        log: Log | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_progress: Callable[[Progress], None] | None = None,
        fault: Callable[[str], None] | None = None,
        hints: ThroughputHints | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.coordinator = coordinator
        self.spec = spec
        self.logic = logic
        clashes = sink_clashes([(spec.stage_id, SinkDecl(s.sink_id, s.target())) for s in sinks])
        if clashes:  # two sinks on one table: every row committed twice (core.definition)
            raise StageDefinitionError(clashes[0])
        self.sinks = {s.sink_id: s for s in sinks}
        self.output_handle = output_handle
        self.log: Log = log or logging.getLogger("airflow_finalckpt.stage")
        self.clock = clock
        self.on_progress = on_progress
        self.fault = fault or (lambda _point: None)
        self.hints = hints
        self.timer = timer
        self.epoch: int | None = None
        #: The plan check of this attempt's batches (one batch when the plan needs it).
        self.gate = PlanGate(spec, logic, self.log, hints, self._batch_boundary)

    # ------------------------------------------------------------------ running

    def _check_changed_split_list(self, view: StageView, recorded: str | None) -> None:
        """A resumed stage whose declared split list is not the one its progress was recorded
        with: refused (permanent) if finished splits are no longer declared, unless the spec
        allows it; else say how the lists differ (nothing is dropped, see ``core.split_list``).
        """
        if view.lifecycle.is_finished:
            return
        finished = view.progress.finished_splits
        restored = self.coordinator.restored_from()
        source = "its last attempt" if restored is None else f"checkpoint {restored}"
        check_finished_splits_declared(
            self.spec.stage_id,
            self.spec.splits,
            finished,
            source,
            self.spec.allow_split_list_change,
        )
        change = split_list_change(recorded, self.spec.splits, finished)
        if change is not None:
            warn = getattr(self.log, "warning", self.log.info)  # Log promises only info
            warn("%s", change.describe(self.spec.stage_id, source))

    def run(self) -> RunResult:
        """Process the pending splits and finish; or stop at a savepoint; or skip if done."""
        stage_id = self.spec.stage_id
        declared = split_list_fingerprint(self.spec.splits)
        before = self.coordinator.stage(stage_id)
        recorded = before.progress.split_list_sha256
        if before.lifecycle.is_finished:  # before start_attempt: a refusal records nothing
            check_finished_split_list(stage_id, recorded, self.spec.splits, self.spec.key_origin)
        view = self.coordinator.start_attempt(
            stage_id, total_splits=len(self.spec.splits), split_list_sha256=declared
        )
        self.epoch = view.epoch
        self._check_changed_split_list(view, recorded)
        skipped = self._skip(view)
        if skipped is not None:
            return skipped
        lease = AttemptLease(
            self.coordinator, stage_id, view.epoch, self.spec.attempt_lease_s, self.log
        )
        with lease:
            return self._run_attempt(view)

    def _run_attempt(self, view: StageView) -> RunResult:
        """The attempt's batches and finish (or its suspension), holding its lease."""
        assert self.epoch is not None
        stage_id = self.spec.stage_id
        graph = self.coordinator.graph()
        upstream = graph.upstream(stage_id)
        output_read = bool(graph.downstream(stage_id))
        source = not upstream
        self._abort_orphaned_transactions()
        progress = view.progress
        pending = remaining_splits(
            self.spec.splits,
            progress.finished_splits,
            ignore_unknown_finished=self.spec.allow_split_list_change,
        )
        outputs, state = _split_state(progress.state)
        sizer = self._sizer()
        self.log.info(
            "stage %s attempt epoch %d: %d of %d splits already finished, %d to process in %s%s",
            stage_id,
            self.epoch,
            len(progress.finished_splits),
            len(self.spec.splits),
            len(pending),
            self.spec.policy.describe(),
            _describe_throughput(sizer.throughput, " (measured before: %s)"),
        )
        self.logic.restore(state, progress.watermark)
        tracker = Progress(total=len(self.spec.splits), done=len(progress.finished_splits))
        last_trigger = self.clock()
        drain = False
        completing = False  # a drain found this source reading its input whole
        unread = 0
        index = 0
        while pending:
            stop = self._batch_boundary()
            if suspends(stop):
                return self._suspend(tracker)
            if source and draining(stop) and self.spec.on_drain == "complete":
                if not completing:
                    completing = True
                    self.log.info(
                        "stop with drain: source stage %s reads its input whole (on_drain="
                        "'complete': downstream stages read it whole), %d of %d splits left",
                        stage_id,
                        len(pending),
                        tracker.total,
                    )
            elif source and draining(stop):
                drain = True
                unread = len(pending)
                self.log.info(
                    "stop with drain: source stage %s stops taking input, %d of %d splits left "
                    "unread",
                    stage_id,
                    unread,
                    tracker.total,
                )
                break
            size = len(pending) if self.gate.whole_input else sizer.next_size(pending)
            self.fault("before-batch")
            batch = self.gate.checked(next_batch(index, pending, size, output_read), pending)
            pending = pending[len(batch.splits) :]
            index += 1
            outputs, state = self._run_batch(batch, outputs, state, sizer, tracker)
            now = self.clock()
            if now - last_trigger >= self.spec.checkpoint_interval_s:
                self.coordinator.trigger(TriggerReason.PERIODIC)
                last_trigger = now
            if self.spec.commit_mode is CommitMode.PROGRESSIVE:
                self.commit_covered()
        stop = self._batch_boundary()
        if suspends(stop):
            # All splits done but not finished: a savepoint stop keeps the stage unfinished
            # (no end of input, no window fires); it finishes right after the resume.
            return self._suspend(tracker)
        cut = draining(stop) and not (source and self.spec.on_drain == "complete")
        drain = drain or cut or self._upstream_drained(upstream)
        return self._finish(tracker, outputs, state, drain=drain, unread=unread)

    def _skip(self, view: StageView) -> RunResult | None:
        """The result of an attempt with nothing to process: the stage is closed, finished
        (waiting for its final checkpoint) or suspended by a stop with savepoint; else None.
        """
        stage_id = self.spec.stage_id
        if view.lifecycle is StageLifecycle.CLOSED:
            eod = view.final_snapshot.end_of_data if view.final_snapshot else None
            self.log.info(
                "stage %s is fully finished (closed on checkpoint %s): no Spark job submitted, "
                "re-publishing its end_of_data",
                stage_id,
                view.closed_checkpoint_id,
            )
            return RunResult(RunStatus.CLOSED, eod, skipped_splits=len(self.spec.splits))
        if view.lifecycle is StageLifecycle.FINISHED:
            eod = view.final_snapshot.end_of_data if view.final_snapshot else None
            self.log.info(
                "stage %s already finished (attempt epoch %d): waiting for its final checkpoint",
                stage_id,
                self.epoch,
            )
            return RunResult(RunStatus.FINISHED, eod, skipped_splits=len(self.spec.splits))
        if view.lifecycle is StageLifecycle.SUSPENDED:
            stop = self.coordinator.stop_request()
            self.log.info(
                "stage %s does not start: the run is stopped with savepoint %s; it waits for a "
                "resume",
                stage_id,
                stop.savepoint_id if stop else None,
            )
            return RunResult(
                RunStatus.SUSPENDED,
                skipped_splits=len(view.progress.finished_splits),
                savepoint_id=stop.savepoint_id if stop else None,
            )
        return None

    def _run_batch(
        self,
        batch: Batch,
        outputs: list[StateHandle],
        state: list[StateHandle],
        sizer: BatchSizer,
        tracker: Progress,
    ) -> tuple[list[StateHandle], list[StateHandle]]:
        """Process one batch, pre-commit its transactions and record it with the coordinator
        (fenced by epoch); returns the output handles and state to record with the next batch.
        """
        assert self.epoch is not None
        started = self.timer()
        out = self._process(batch)
        if out.parts and self.output_handle is not None:
            outputs = [*outputs, self.output_handle(batch, out.parts)]
        if out.state is not None:
            state = list(out.state)
        self.fault("before-record-batch")
        txns = with_partitions(self._precommit(batch.key), out.partition_keys)
        try:
            outcome = self.coordinator.record_batch(
                self.spec.stage_id,
                self.epoch,
                finished_splits=batch.splits,
                state=[*outputs, *state],
                transactions=txns,
                watermark=out.watermark,
            )
        except StaleEpochError:
            self._abort_stale_transactions(txns)
            raise
        self.fault("after-record-batch")
        seconds = self.timer() - started
        metrics.batch(self.spec.stage_id, seconds, len(batch.splits))
        sizer.observe(batch.splits, seconds)
        if self.hints is not None and sizer.throughput is not None and self.spec.policy.auto:
            self.hints.save(self.spec.stage_id, sizer.throughput)
        tracker.done += len(batch.splits)
        tracker.processed.extend(batch.splits)
        tracker.batches.append((len(batch.splits), seconds))
        tracker.throughput = sizer.throughput
        self._report(tracker, batch, outcome.acked)
        return outputs, state

    def _sizer(self) -> BatchSizer:
        policy = self.spec.policy
        hint = None
        if policy.auto and self.hints is not None:
            hint = self.hints.load(self.spec.stage_id)
        weigh = getattr(self.logic, "split_weights", None) if policy.auto else None
        return BatchSizer(policy, weigh, hint)

    def _batch_boundary(self) -> StopRequest | None:
        """Fenced read before each batch: a zombie attempt stops here, before any Spark work."""
        assert self.epoch is not None
        try:
            return self.coordinator.batch_boundary(self.spec.stage_id, self.epoch)
        except StaleEpochError as exc:
            self.log.info(
                "stage %s: this attempt (epoch %d) is stale, epoch %d owns the stage now; "
                "stopping without further work",
                self.spec.stage_id,
                self.epoch,
                exc.current,
            )
            raise

    def _upstream_drained(self, upstream: Sequence[str]) -> bool:
        """end_of_data with drain=true flows downstream: a stage fed by a drained stage is
        drained too (its output is complete for what was read, not for all the input).
        """
        if not upstream:
            return False  # a source: nothing flows into it
        views = self.coordinator.stages()
        for up in upstream:
            final = views[up].final_snapshot
            if final is not None and final.end_of_data is not None and final.end_of_data.drain:
                return True
        return False

    def _process(self, batch: Batch) -> BatchOutput:
        try:
            out = self.logic.process(batch, self._txn_ids(batch.key))
        except Exception:
            # A zombie that stalled inside its batch may find its inputs collected by the
            # newer attempt: report what really happened (StaleEpochError), not a missing file.
            self._batch_boundary()
            raise
        self.fault("mid-batch")
        return out

    def _txn_ids(self, key: str) -> dict[str, str]:
        """Each sink's transaction of batch ``key`` (its own: the sink id is part of it)."""
        spec = self.spec
        return {
            sid: transaction_id(spec.pipeline_key, spec.stage_id, key, self.epoch, sid)
            for sid in self.sinks
        }

    def _precommit(self, key: str) -> list[SinkTransaction]:
        # The covering checkpoint is stamped by the coordinator; 0 means "not yet covered".
        return [
            sink.precommit(txn_id, 0)
            for sid, sink in self.sinks.items()
            for txn_id in [self._txn_ids(key)[sid]]
        ]

    def _abort_stale_transactions(self, txns: Sequence[SinkTransaction]) -> None:
        """A newer attempt took the stage over while this one pre-committed ``txns``, so the
        coordinator refused to record them and nobody else will ever abort them (the newer
        attempt's orphan sweep may have run before they were sealed). Their ids carry this
        attempt's epoch: no other attempt owns them, abort them in the sinks. Best effort: the
        StaleEpochError being handled is what the caller must see.
        """
        for txn in txns:
            sink = self.sinks.get(txn.sink_id)
            if sink is None:
                continue
            try:
                sink.abort(txn)
            except Exception as exc:
                warn = getattr(self.log, "warning", self.log.info)
                warn(
                    "stage %s: cannot abort transaction %s of sink %s of this stale attempt "
                    "(epoch %s): %s",
                    self.spec.stage_id,
                    txn.txn_id,
                    txn.sink_id,
                    self.epoch,
                    exc,
                )
            else:
                self.log.info(
                    "stage %s: aborted transaction %s of sink %s: this attempt (epoch %s) is "
                    "stale, it was never recorded",
                    self.spec.stage_id,
                    txn.txn_id,
                    txn.sink_id,
                    self.epoch,
                )

    def _finish(
        self,
        tracker: Progress,
        outputs: list[StateHandle],
        state: list[StateHandle],
        *,
        drain: bool,
        unread: int,
    ) -> RunResult:
        assert self.epoch is not None
        key = "finish"
        try:
            out = self.logic.finish(drain, self._txn_ids(key))
        except Exception:
            self._batch_boundary()  # a stale attempt stops with StaleEpochError (see _process)
            raise
        if out.parts and self.output_handle is not None:
            outputs = [
                *outputs,
                self.output_handle(Batch(index=-1, key=key, splits=()), out.parts),
            ]
        if out.state is not None:
            state = list(out.state)
        txns = with_partitions(self._precommit(key), out.partition_keys)
        self.fault("before-finish")
        manifest = [part for h in outputs for part in output_parts(h)]
        try:
            result = self.coordinator.finish(
                self.spec.stage_id,
                self.epoch,
                StageSnapshot(
                    state=(*outputs, *state),
                    pending_transactions=tuple(txns),
                    watermark=MAX_WATERMARK,
                    end_of_data=EndOfData(
                        drain=drain,
                        manifest=manifest,
                        watermark=MAX_WATERMARK,
                        unread_splits=unread,
                    ),
                ),
            )
        except StaleEpochError:
            self._abort_stale_transactions(txns)
            raise
        self.fault("after-finish")
        metrics.stage_finished(self.spec.stage_id)
        self.log.info(
            "stage %s finished (%s): %d splits processed in this attempt, %d parts; final "
            "checkpoint is the first completed checkpoint >= %d (eager checkpoint %s %s)",
            self.spec.stage_id,
            "drained" if drain else "end of input",
            len(tracker.processed),
            len(manifest),
            result.threshold,
            result.eager_checkpoint_id,
            "joined" if result.joined else "triggered",
        )
        return RunResult(
            RunStatus.FINISHED,
            result.end_of_data,
            processed_splits=tuple(tracker.processed),
            skipped_splits=tracker.total - len(tracker.processed),
        )

    def _suspend(self, tracker: Progress) -> RunResult:
        """Stop with savepoint: answer the savepoint at this batch boundary, do not finish."""
        assert self.epoch is not None
        self.coordinator.record_batch(self.spec.stage_id, self.epoch)
        self.coordinator.suspend(self.spec.stage_id, self.epoch)
        stop = self.coordinator.stop_request()
        self.log.info(
            "stop with savepoint: stage %s suspended at a batch boundary (%d/%d splits done); "
            "savepoint %s",
            self.spec.stage_id,
            tracker.done,
            tracker.total,
            stop.savepoint_id if stop else None,
        )
        return RunResult(
            RunStatus.SUSPENDED,
            processed_splits=tuple(tracker.processed),
            savepoint_id=stop.savepoint_id if stop else None,
        )

    def _report(self, tracker: Progress, batch: Batch, acked: Sequence[int]) -> None:
        pct = 100.0 * tracker.done / tracker.total if tracker.total else 100.0
        splits, seconds = tracker.batches[-1] if tracker.batches else (len(batch.splits), 0.0)
        self.log.info(
            "stage %s: %d/%d splits (%.0f%%) after batch %s (%d splits in %.2fs%s)%s",
            self.spec.stage_id,
            tracker.done,
            tracker.total,
            pct,
            batch.key,
            splits,
            seconds,
            _describe_throughput(tracker.throughput, "; %s") if self.spec.policy.auto else "",
            f"; acknowledged checkpoints {list(acked)}" if acked else "",
        )
        if self.on_progress is not None:
            self.on_progress(tracker)

    # ------------------------------------------------------------------ closing

    def closer(self) -> StageCloser:
        """The commit/close side of this attempt: its epoch, sinks, log and fault seam."""
        return StageCloser(
            self.coordinator,
            self.spec.stage_id,
            tuple(self.sinks.values()),
            epoch=self.epoch,
            log=self.log,
            fault=self.fault,
            gc_source=self.logic,
        )

    def commit_covered(self) -> int:
        """Commit every transaction a completed checkpoint covers (see ``StageCloser``)."""
        return self.closer().commit_covered()

    def try_close(self, epoch: int | None = None) -> EndOfData | None:
        """Close this stage if a qualifying checkpoint completed (see ``StageCloser``)."""
        if epoch is not None:
            self.epoch = epoch
        closer = self.closer()
        eod = closer.try_close()
        self.epoch = closer.epoch
        return eod

    def _abort_orphaned_transactions(self) -> None:
        """Drop what crashed batches staged (see ``closer.abort_orphaned_transactions``)."""
        abort_orphaned_transactions(
            self.coordinator, self.spec.stage_id, tuple(self.sinks.values()), self.log
        )


def _describe_throughput(throughput: Throughput | None, template: str) -> str:
    """The measured rate placed in ``template``; "" when nothing was measured."""
    return "" if throughput is None else template % throughput.rate()
