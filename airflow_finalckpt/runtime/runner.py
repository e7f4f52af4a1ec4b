"""The stage runtime: drives one stage attempt through FLIP-147's lifecycle.

RUNNING: pending splits are processed in batches; after each batch its progress (finished
splits, output parts, state, pre-committed sink transactions) is made durable in one coordinator
transition that also answers pending checkpoints, so a crash redoes at most the in-flight batch.
FINISHED (WAITING_FOR_FINAL_CP): endInput() + finish() flushed the state (every window fires),
pre-committed the last transactions, published end_of_data and triggered the eager final
checkpoint. CLOSED: once a qualifying checkpoint completed, covered transactions are committed,
later ones aborted.

The runtime knows neither Airflow nor Spark: a ``StageLogic`` does the work of a batch.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from airflow_finalckpt import metrics
from airflow_finalckpt.core.assignment import remaining_splits
from airflow_finalckpt.core.batching import (
    DEFAULT_MAX_BATCH_SPLITS,
    DEFAULT_TARGET_BATCH_S,
    BatchPolicy,
    BatchSample,
    Throughput,
    fit,
    next_batch_size,
    policy_from,
)
from airflow_finalckpt.core.errors import (
    FinalCheckpointError,
    IllegalTransitionError,
    StaleEpochError,
)
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
from airflow_finalckpt.core.ports import CoordinatorPort
from airflow_finalckpt.core.views import StageView, StopRequest, draining, suspends
from airflow_finalckpt.runtime.gc import collect_after_close
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink


class CommitMode(StrEnum):
    """PROGRESSIVE commits every transaction as soon as a completed checkpoint covers it;
    FINAL publishes the whole stage's output at its final checkpoint only.
    """

    PROGRESSIVE = "progressive"
    FINAL = "final"


class RunStatus(StrEnum):
    """How an attempt ended: input finished, suspended by a stop with savepoint, or closed."""

    FINISHED = "finished"
    SUSPENDED = "suspended"
    CLOSED = "closed"


@dataclass(frozen=True)
class StageSpec:
    """``batch_size``: ``"auto"`` (batches of about ``target_batch_s`` seconds) or a split count."""

    pipeline_key: str
    stage_id: str
    splits: tuple[str, ...]
    batch_size: int | str = "auto"
    checkpoint_interval_s: float = 60.0
    commit_mode: CommitMode = CommitMode.PROGRESSIVE
    target_batch_s: float = DEFAULT_TARGET_BATCH_S
    max_batch_splits: int = DEFAULT_MAX_BATCH_SPLITS

    def __post_init__(self) -> None:
        self.policy  # noqa: B018 - validates batch_size and target_batch_s

    @property
    def policy(self) -> BatchPolicy:
        """The batch sizing policy of ``batch_size``, ``target_batch_s`` and the split cap."""
        return policy_from(self.batch_size, self.target_batch_s, self.max_batch_splits)


@dataclass(frozen=True)
class Batch:
    """One unit of Spark work: a deterministic key (so a redone batch writes the same part)."""

    index: int
    key: str
    splits: tuple[str, ...]
    #: It takes the stage's last unfinished splits: the input ends with this batch.
    last: bool = False
    #: A downstream stage reads the stage's output parts (False: only its sinks keep output).
    output_read: bool = True


@dataclass(frozen=True)
class BatchOutput:
    """What a batch (or the finish) produced: output parts, new state, watermark."""

    parts: tuple[str, ...] = ()
    state: tuple[StateHandle, ...] | None = None
    watermark: int | None = None


class Log(Protocol):
    """Any logger with ``info`` (stdlib, or the Task SDK's structlog logger)."""

    def info(self, event: Any, *args: Any, **kw: Any) -> Any:
        """Log ``event`` (a %-format string with ``args``)."""
        ...


class StageLogic(Protocol):
    """What a stage does; the Spark adapter implements it (and may offer ``split_weights``:
    the input bytes of each split, so auto batches are sized by bytes, not split counts).
    """

    def restore(self, state: Sequence[StateHandle], watermark: int | None) -> None:
        """Load the state and watermark the last recorded batch left (none on a fresh start)."""
        ...

    def process(self, batch: Batch, txn_ids: Mapping[str, str]) -> BatchOutput:
        """Run one batch, writing sink rows under ``txn_ids`` (sink id -> transaction id)."""
        ...

    def finish(self, drain: bool, txn_ids: Mapping[str, str]) -> BatchOutput:
        """End of input: flush what state holds back (all windows when ``drain``)."""
        ...


@dataclass(frozen=True)
class RunResult:
    """The outcome of ``StageRunner.run``: status, end-of-data record, splits done or skipped."""

    status: RunStatus
    end_of_data: EndOfData | None = None
    processed_splits: tuple[str, ...] = ()
    skipped_splits: int = 0
    savepoint_id: int | None = None


class ThroughputHints(Protocol):
    """Where a stage's measured batch throughput is kept between attempts and runs."""

    def load(self, stage_id: str) -> Throughput | None:
        """The stage's last stored throughput, or None."""
        ...

    def save(self, stage_id: str, throughput: Throughput) -> None:
        """Keep the stage's throughput for the next attempt or run."""
        ...


@dataclass
class Progress:
    """Split progress of this attempt, for logs and progress bars."""

    total: int
    done: int
    processed: list[str] = field(default_factory=list)
    #: (splits, seconds) of every batch of this attempt, and the current throughput estimate.
    batches: list[tuple[int, float]] = field(default_factory=list)
    throughput: Throughput | None = None


class BatchSizer:
    """Sizes an attempt's batches from the policy, the samples so far and a stored hint.

    Weights are input bytes when the logic knows every pending split's size (upstream output
    parts), else split counts; a hint measured in the other unit is ignored.
    """

    def __init__(
        self,
        policy: BatchPolicy,
        weigh: Callable[[Sequence[str]], Sequence[int | None]] | None = None,
        hint: Throughput | None = None,
    ) -> None:
        self.policy = policy
        self._weigh = weigh
        self._weights: dict[str, float] = {}
        self._hint = hint
        self.by_bytes: bool | None = None if weigh is not None else False
        self.samples: list[BatchSample] = []
        self.throughput: Throughput | None = None
        if self.by_bytes is False:
            self._use_hint()

    def _use_hint(self) -> None:
        if self._hint is not None and self._hint.by_bytes == self.by_bytes:
            self.samples = list(self._hint.samples)
            self.throughput = self._hint

    def weights(self, splits: Sequence[str]) -> list[float]:
        """Bytes per split (at least 1) when known for all of them, else 1 per split."""
        if self.by_bytes is not False and self._weigh is not None:
            missing = [s for s in splits if s not in self._weights]
            found = list(self._weigh(missing)) if missing else []
            if len(found) != len(missing) or any(w is None for w in found):
                self.by_bytes, self.samples, self.throughput = False, [], None
                self._use_hint()
            else:
                self._weights.update(
                    {s: float(max(int(w or 0), 1)) for s, w in zip(missing, found, strict=True)}
                )
                if self.by_bytes is None:
                    self.by_bytes = True
                    self._use_hint()
        if not self.by_bytes:
            return [1.0] * len(splits)
        return [self._weights[s] for s in splits]

    def next_size(self, pending: Sequence[str]) -> int:
        """How many of the ``pending`` splits the next batch takes."""
        if self.policy.fixed is not None:
            return min(self.policy.fixed, len(pending))
        window = pending[: self.policy.max_splits]
        weights = self.weights(window)
        return next_batch_size(self.policy, self.throughput, weights)

    def observe(self, splits: Sequence[str], seconds: float) -> None:
        """Add a measured batch to the samples and refit the throughput."""
        weight = sum(self.weights(splits))
        self.samples.append(BatchSample(len(splits), weight, max(seconds, 0.0)))
        self.throughput = fit(self.samples, by_bytes=bool(self.by_bytes))


def batch_key(splits: Sequence[str]) -> str:
    """A stable, path-safe name of a batch: its first split's tail plus a digest of all."""
    digest = hashlib.sha1("\n".join(splits).encode()).hexdigest()[:10]
    tail = re.sub(r"[^A-Za-z0-9_.-]", "_", splits[0].rsplit("/", 1)[-1])[:40].lstrip(".-")
    return f"{tail or 'b'}-n{len(splits)}-{digest}"


def transaction_prefix(pipeline_key: str, stage_id: str) -> str:
    """What every transaction id of one stage of one pipeline starts with: pipelines sharing a
    sink never write to, commit or sweep each other's transactions.
    """
    digest = hashlib.sha1(pipeline_key.encode()).hexdigest()[:10]
    return f"{stage_id}.p{digest}."


def transaction_id(pipeline_key: str, stage_id: str, batch: str, epoch: int | None) -> str:
    """``<stage>.p<pipeline digest>.<batch key>.e<epoch>``: one per batch and attempt, at most
    200 characters (a long stage id or batch key is shortened with a digest, never the epoch).
    """
    body, suffix = f"{transaction_prefix(pipeline_key, stage_id)}{batch}", f".e{epoch}"
    if len(body) + len(suffix) > 200:
        body = f"{body[:180]}-{hashlib.sha1(body.encode()).hexdigest()[:10]}"
    return body + suffix


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
        self.sinks = {s.sink_id: s for s in sinks}
        self.output_handle = output_handle
        self.log: Log = log or logging.getLogger("airflow_finalckpt.stage")
        self.clock = clock
        self.on_progress = on_progress
        self.fault = fault or (lambda _point: None)
        self.hints = hints
        self.timer = timer
        self.epoch: int | None = None

    # ------------------------------------------------------------------ running

    def run(self) -> RunResult:
        """Process the pending splits and finish; or stop at a savepoint; or skip if done."""
        stage_id = self.spec.stage_id
        view = self.coordinator.start_attempt(stage_id, total_splits=len(self.spec.splits))
        self.epoch = view.epoch
        skipped = self._skip(view)
        if skipped is not None:
            return skipped
        graph = self.coordinator.graph()
        upstream = graph.upstream(stage_id)
        output_read = bool(graph.downstream(stage_id))
        source = not upstream
        self._abort_orphaned_transactions()
        progress = view.progress
        pending = remaining_splits(self.spec.splits, progress.finished_splits)
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
        unread = 0
        index = 0
        while pending:
            stop = self._batch_boundary()
            if suspends(stop):
                return self._suspend(tracker)
            if source and draining(stop):
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
            splits = pending[: sizer.next_size(pending)]
            pending = pending[len(splits) :]
            batch = Batch(
                index=index,
                key=batch_key(splits),
                splits=tuple(splits),
                last=not pending,
                output_read=output_read,
            )
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
        drain = drain or draining(stop) or self._upstream_drained(upstream)
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
        txns = self._precommit(batch.key)
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
        self.fault("before-batch")
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
        txn_id = transaction_id(self.spec.pipeline_key, self.spec.stage_id, key, self.epoch)
        return dict.fromkeys(self.sinks, txn_id)

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
        txns = self._precommit(key)
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
            "checkpoint is the first completed checkpoint >= %d (eager checkpoint %s triggered)",
            self.spec.stage_id,
            "drained" if drain else "end of input",
            len(tracker.processed),
            len(manifest),
            result.threshold,
            result.eager_checkpoint_id,
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
        """Staged transactions the coordinator never recorded (a crashed batch) or aborted (a
        restore to an earlier checkpoint) are dropped from the sinks.
        """
        known = {t.txn_id: state for t, state in self.coordinator.transactions(self.spec.stage_id)}
        prefix = transaction_prefix(self.spec.pipeline_key, self.spec.stage_id)
        for sink in self.sinks.values():
            for txn_id in sorted(sink.staged_txn_ids()):
                if txn_id.startswith(prefix) and known.get(txn_id, "ABORTED") == "ABORTED":
                    self.log.info(
                        "aborting orphaned transaction %s of sink %s", txn_id, sink.sink_id
                    )
                    sink.abort(
                        SinkTransaction(sink_id=sink.sink_id, txn_id=txn_id, checkpoint_id=0)
                    )


class StageCloser:
    """Commit and close of a finished stage (FLIP-147's close()): it needs no stage logic, since
    commits are file renames and database transactions, so a task back from the triggerer (or
    whose Spark driver ran elsewhere) closes its stage without Spark.
    """

    def __init__(
        self,
        coordinator: CoordinatorPort,
        stage_id: str,
        sinks: Sequence[TwoPhaseCommitSink] = (),
        *,
        epoch: int | None = None,
        log: Log | None = None,
        fault: Callable[[str], None] | None = None,
        gc_source: object = None,
    ) -> None:
        self.coordinator = coordinator
        self.stage_id = stage_id
        self.sinks = {s.sink_id: s for s in sinks}
        #: the attempt's epoch (commits are fenced by it); None: the stage's current epoch
        self.epoch = epoch
        self.log: Log = log or logging.getLogger("airflow_finalckpt.stage")
        self.fault = fault or (lambda _point: None)
        #: has a ``storage`` attribute (the stage logic): where the collection after close
        #: looks when the coordinator writes no checkpoint storage
        self.gc_source = gc_source

    def commit_covered(self) -> int:
        """Commit every transaction a completed checkpoint covers (idempotent, fenced)."""
        assert self.epoch is not None
        committed = 0
        for txn in self.coordinator.committable_transactions(self.stage_id):
            sink = self.sinks.get(txn.sink_id)
            if sink is None:
                raise FinalCheckpointError(
                    f"stage {self.stage_id!r} has a transaction for sink {txn.sink_id!r}, "
                    "which is not configured any more; restore the sink to commit it"
                )
            self.coordinator.check_epoch(self.stage_id, self.epoch)
            self.fault("before-commit")
            started = time.monotonic()
            sink.commit(txn)
            metrics.commit(self.stage_id, txn.sink_id, time.monotonic() - started)
            self.fault("mid-commit")
            if self.coordinator.mark_committed(self.stage_id, self.epoch, txn.sink_id, txn.txn_id):
                committed += 1
        return committed

    def try_close(self) -> EndOfData | None:
        """If a qualifying checkpoint completed: commit up to it, abort later ones, close."""
        if self.epoch is None:
            self.epoch = self.coordinator.stage(self.stage_id).epoch
        stage_id = self.stage_id
        checkpoint_id = self.coordinator.closable_checkpoint(stage_id)
        if checkpoint_id is None:
            return None
        view = self.coordinator.stage(stage_id)
        if view.lifecycle is not StageLifecycle.CLOSED:
            committed = self.commit_covered()
            try:
                aborted = self.coordinator.close(stage_id, self.epoch, checkpoint_id)
            except IllegalTransitionError as exc:  # a savepoint stop started meanwhile
                self.log.info("stage %s keeps waiting: %s", stage_id, exc)
                return None
            for txn in aborted:
                sink = self.sinks.get(txn.sink_id)
                if sink is not None:
                    sink.abort(txn)
            metrics.stage_closed(stage_id)
            self.log.info(
                "stage %s closed on checkpoint %d: %d transactions committed now, %d aborted",
                stage_id,
                checkpoint_id,
                committed,
                len(aborted),
            )
            # Outputs this stage consumed may be collectable now; never raises (logs a warning).
            collect_after_close(self.coordinator, self.gc_source, self.log)
            view = self.coordinator.stage(stage_id)
        return view.final_snapshot.end_of_data if view.final_snapshot else None


def _describe_throughput(throughput: Throughput | None, template: str) -> str:
    """The measured rate placed in ``template``; "" when nothing was measured."""
    return "" if throughput is None else template % throughput.rate()
