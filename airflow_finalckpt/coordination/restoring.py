"""Starting a pipeline on a graph and restoring it from a checkpoint, inside the locked
transition: the checks of ``core.restore`` first (nothing written if one refuses), then the
rows.
"""

from __future__ import annotations

from collections.abc import Collection

from airflow_finalckpt.coordination.checkpointing import Checkpointing, Tx
from airflow_finalckpt.core import failure
from airflow_finalckpt.core import transitions_stage as stage_rules
from airflow_finalckpt.core.driving import DagRunRef, check_drive
from airflow_finalckpt.core.errors import UnknownStageError
from airflow_finalckpt.core.failure import CheckpointFailureReason
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import (
    CheckpointRecord,
    StageProgress,
    StopState,
    TransactionState,
)
from airflow_finalckpt.core.restore import (
    GraphChange,
    RestorePlan,
    plan_graph_change,
    plan_restore,
)


def claim_drive(tx: Tx, me: tuple[str, str], *, take_over: bool, now: float) -> bool:
    """Before anything is written: may DAG run ``me`` drive the pipeline (``core.driving``)?
    True if it becomes the driver (the caller records it once its checks passed).
    """
    driver = tx.rows.driver
    mine = DagRunRef(*me, joined_at=tx.rows.joined_at(*me))
    current = None if driver is None else DagRunRef(*driver, joined_at=tx.rows.joined_at(*driver))
    live = tx.rows.live_stages(now) if driver is not None and not mine.same_run(current) else []
    return check_drive(tx.rows.key, current, mine, live, take_over=take_over)


def check_start(
    tx: Tx,
    graph: StageGraph,
    record: CheckpointRecord | None,
    source: str | None,
    allow_drop_stages: Collection[str],
) -> tuple[RestorePlan | None, GraphChange | None]:
    """Before anything is written: the restore plan of a ``record`` not yet restored from
    ``source``, else the checked change from a stored graph with another fingerprint.
    """
    key = tx.rows.key
    if record is not None and tx.rows.restored_source != source:
        plan = plan_restore(record, graph, pipeline_key=key, allow_drop_stages=allow_drop_stages)
        return plan, None
    if tx.rows.fingerprint != graph.fingerprint:
        old = StageGraph.from_dict(tx.rows.graph_data())
        progress = {
            sid: StageProgress(
                lifecycle=row.lifecycle,
                finished_splits=row.progress.finished_splits,
                total_splits=row.total_splits,
            )
            for sid, row in tx.rows.stage_rows().items()
            if sid in old
        }
        change = plan_graph_change(
            old, progress, graph, pipeline_key=key, allow_drop_stages=allow_drop_stages
        )
        return None, change
    return None, None


def apply_restore(
    ops: Checkpointing,
    tx: Tx,
    plan: RestorePlan,
    record: CheckpointRecord,
    source: str,
    now: float,
) -> None:
    """Reset every stage to ``record``: pending checkpoints aborted, the stop resumed, the
    checkpoint imported if unknown, the id counter moved past it.
    """
    checkpoint_id = record.checkpoint_id
    for cid in tx.rows.pending_ids():
        ops.abort(tx, cid, CheckpointFailureReason.RESTORED, failure.restored(source))
    stop = tx.rows.latest_stop()
    if stop is not None and stop.state is not StopState.RESUMED:
        tx.rows.update_stop(stop.request_id, state=StopState.RESUMED)
    if tx.rows.checkpoint_state(checkpoint_id) is None:
        tx.rows.import_checkpoint(record, source)
    tx.rows.mark_restored(source, max(tx.rows.next_id_locked, checkpoint_id + 1), now)
    rows = tx.rows.stage_rows()
    for sid, decision in plan.stages.items():
        row = rows.get(sid)
        if row is None:
            raise UnknownStageError(
                f"stage {sid!r} is not registered for pipeline {tx.rows.key!r}; "
                "register the current graph before restoring"
            )
        for txn in stage_rules.restore_aborts(decision, tx.rows.uncommitted(sid)):
            tx.rows.set_transaction_state(
                sid, txn.sink_id, txn.txn_id, TransactionState.ABORTED, now
            )
        for txn in decision.pending_transactions:
            tx.rows.restore_transaction(sid, txn, row.epoch + 1, checkpoint_id, now)
        tx.rows.update_stage(sid, stage_rules.restore(row, decision, checkpoint_id), now)
