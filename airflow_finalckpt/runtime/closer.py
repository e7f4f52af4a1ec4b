"""Commit and close of a finished stage (FLIP-147's close()), apart from the runner: it needs no
stage logic, so a task back from the triggerer closes its stage without Spark.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from airflow_finalckpt import metrics
from airflow_finalckpt.core.errors import FinalCheckpointError, IllegalTransitionError
from airflow_finalckpt.core.model import EndOfData, SinkTransaction, StageLifecycle
from airflow_finalckpt.core.ports import CoordinatorPort
from airflow_finalckpt.runtime.batches import transaction_prefix
from airflow_finalckpt.runtime.gc import collect_after_close
from airflow_finalckpt.runtime.values import Log
from airflow_finalckpt.sinks.base import TwoPhaseCommitSink


def abort_orphaned_transactions(
    coordinator: CoordinatorPort,
    stage_id: str,
    sinks: Sequence[TwoPhaseCommitSink],
    log: Log,
) -> list[str]:
    """Staged transactions of the stage that the coordinator never recorded (a crashed batch)
    or aborted (a restore to an earlier checkpoint) are dropped from the sinks; returns their
    ids. Run when an attempt starts and again once the stage closed: a dead attempt's writer
    (a Spark job still finishing after its task was killed) may stage again after the start's
    sweep, and after close no attempt of the stage may stage anything.
    """
    known = {t.txn_id: state for t, state in coordinator.transactions(stage_id)}
    prefix = transaction_prefix(coordinator.pipeline_key, stage_id)
    aborted: list[str] = []
    for sink in sinks:
        for txn_id in sorted(sink.staged_txn_ids()):
            if txn_id.startswith(prefix) and known.get(txn_id, "ABORTED") == "ABORTED":
                log.info("aborting orphaned transaction %s of sink %s", txn_id, sink.sink_id)
                sink.abort(SinkTransaction(sink_id=sink.sink_id, txn_id=txn_id, checkpoint_id=0))
                aborted.append(txn_id)
    return aborted


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
        """Commit every transaction a completed checkpoint covers (idempotent, fenced). A sink
        that owns a slice (``replace_slice``) takes all of its transactions in one commit that
        replaces the slice (only a final commit covers them all: progressive commits are
        refused with a slice when the DAG is parsed).
        """
        assert self.epoch is not None
        committed = 0
        groups: dict[str, list[SinkTransaction]] = {}
        for txn in self.coordinator.committable_transactions(self.stage_id):
            sink = self.sinks.get(txn.sink_id)
            if sink is None:
                raise FinalCheckpointError(
                    f"stage {self.stage_id!r} has a transaction for sink {txn.sink_id!r}, "
                    "which is not configured any more; restore the sink to commit it"
                )
            if sink.replace_slice:
                groups.setdefault(sink.sink_id, []).append(txn)
                continue
            self.coordinator.check_epoch(self.stage_id, self.epoch)
            self.fault("before-commit")
            started = time.monotonic()
            sink.commit(txn)
            metrics.commit(self.stage_id, txn.sink_id, time.monotonic() - started)
            self.fault("mid-commit")
            if self.coordinator.mark_committed(self.stage_id, self.epoch, txn.sink_id, txn.txn_id):
                committed += 1
        for sink_id, txns in groups.items():
            self.coordinator.check_epoch(self.stage_id, self.epoch)
            self.fault("before-commit")
            started = time.monotonic()
            replaced = self.sinks[sink_id].commit_replacing(txns)
            metrics.commit(self.stage_id, sink_id, time.monotonic() - started)
            self.fault("mid-commit")
            self.log.info(
                "stage %s: sink %s %s slice %s with %d transactions",
                self.stage_id,
                sink_id,
                "replaced" if replaced else "had already replaced",
                self.sinks[sink_id].replace_slice,
                len(txns),
            )
            for txn in txns:
                if self.coordinator.mark_committed(self.stage_id, self.epoch, sink_id, txn.txn_id):
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
            abort_orphaned_transactions(
                self.coordinator, stage_id, tuple(self.sinks.values()), self.log
            )
            # Outputs this stage consumed may be collectable now; never raises (logs a warning).
            collect_after_close(self.coordinator, self.gc_source, self.log)
            view = self.coordinator.stage(stage_id)
        return view.final_snapshot.end_of_data if view.final_snapshot else None
