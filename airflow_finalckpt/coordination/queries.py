"""The coordinator's reads: what the runtime, the triggers, the CLI and the UI ask about a
pipeline without changing it (plain read transactions, never the pipeline lock).
"""

from __future__ import annotations

from airflow_finalckpt.core import transitions_stage as stage_rules
from airflow_finalckpt.core.graph import StageGraph
from airflow_finalckpt.core.model import SinkTransaction, StageLifecycle, StageSnapshot
from airflow_finalckpt.core.rerun import TaskTry
from airflow_finalckpt.core.views import (
    CheckpointInfo,
    PipelineSnapshot,
    StageView,
    StopRequest,
    closable_on,
)
from airflow_finalckpt.store.repository import CoordinationStore


class CoordinatorReads:
    """Read-only questions about one pipeline (the base of ``Coordinator``)."""

    store: CoordinationStore

    def closed_before_dag_run(self, stage_id: str, dag_id: str, run_id: str) -> bool:
        """Whether the stage is CLOSED and its row was last changed before this DAG run joined
        the pipeline: its commit belongs to (and was announced by) an earlier DAG run, so this
        run only re-publishes its end_of_data. A stage closed within this DAG run (say by an
        attempt killed before Airflow recorded its success) is not: its commit is still news.
        """
        return self.store.closed_before_dag_run(stage_id, dag_id, run_id)

    def published_by(self, stage_id: str) -> TaskTry | None:
        """The try that returned the CLOSED stage to Airflow, None if none did since it last
        closed (``core.rerun``).
        """
        return TaskTry.from_dict(self.store.published_by(stage_id))

    def driver(self) -> tuple[str, str] | None:
        """(dag_id, run_id) of the DAG run driving the pipeline (``core.driving``)."""
        return self.store.driver()

    def dag_runs(self) -> list[tuple[str, str]]:
        """The (dag_id, run_id) pairs of the DAG runs this pipeline run spans, oldest first."""
        return self.store.dag_runs()

    def graph(self) -> StageGraph:
        """The stored graph."""
        with self.store.read() as rows:
            return StageGraph.from_dict(rows.graph_data())

    def batch_boundary(self, stage_id: str, epoch: int) -> StopRequest | None:
        """One cheap read before each split batch: StaleEpochError if a newer attempt took the
        stage over (a zombie stops before wasting Spark work), else the latest stop request.
        """
        with self.store.read() as rows:
            stage_rules.fence(rows.stage_row(stage_id), epoch)
            return rows.latest_stop()

    def check_epoch(self, stage_id: str, epoch: int) -> None:
        """Raise StaleEpochError unless ``epoch`` is the stage's current attempt."""
        with self.store.read() as rows:
            stage_rules.fence(rows.stage_row(stage_id), epoch)

    def closable_checkpoint(self, stage_id: str) -> int | None:
        """The checkpoint a finished stage may close on now, or None if it must keep waiting."""
        with self.store.read() as rows:
            row = rows.stage_row(stage_id)
            if row.lifecycle is not StageLifecycle.FINISHED:
                return closable_on(row.lifecycle, row.closed_checkpoint_id, None, None)
            stop = rows.latest_stop()
            first = rows.first_completed_from(row.finish_threshold)
            return closable_on(row.lifecycle, row.closed_checkpoint_id, stop, first)

    def committable_transactions(self, stage_id: str) -> list[SinkTransaction]:
        """Pre-committed transactions of the stage covered by a completed checkpoint."""
        with self.store.read() as rows:
            rows.stage_row(stage_id)
            latest = rows.latest_completed_id()
            if latest is None:
                return []
            return stage_rules.committable(rows.uncommitted(stage_id), latest)

    def restored_from(self) -> str | None:
        """The checkpoint or savepoint the pipeline was last restored from."""
        with self.store.read() as rows:
            return rows.restored_from()

    def stop_request(self) -> StopRequest | None:
        """The latest stop request."""
        with self.store.read() as rows:
            return rows.latest_stop()

    def waiting_snapshot(self) -> PipelineSnapshot:
        """Everything waiting stages decide on, in one read transaction of five statements
        whatever the number of stages (a consistent snapshot: REPEATABLE READ on PostgreSQL,
        SQLite's read transaction). UnknownPipelineError if the pipeline is not registered.
        """
        with self.store.read(repeatable=True) as rows:
            return rows.waiting_snapshot()

    def pending_ack_snapshots(self) -> list[tuple[int, str, bool, StageSnapshot]]:
        """(checkpoint id, stage id, by finish, snapshot) of every acknowledgement of a pending
        checkpoint (garbage collection keeps what they reference).
        """
        with self.store.read() as rows:
            return [
                (cid, ack.stage_id, ack.by_finish, ack.snapshot)
                for cid, ack in rows.pending_ack_snapshots()
            ]

    def stages(self) -> dict[str, StageView]:
        """Every stage's view, by stage id."""
        with self.store.read() as rows:
            return {sid: row.view() for sid, row in rows.stage_rows().items()}

    def stage(self, stage_id: str) -> StageView:
        """One stage's view."""
        with self.store.read() as rows:
            return rows.stage_row(stage_id).view()

    def checkpoints(self, *, limit: int | None = None) -> list[CheckpointInfo]:
        """Checkpoints, newest first."""
        with self.store.read() as rows:
            return rows.checkpoints(limit=limit)

    def checkpoint(self, checkpoint_id: int) -> CheckpointInfo:
        """One checkpoint; UnknownCheckpointError if there is none."""
        with self.store.read() as rows:
            return rows.checkpoint(checkpoint_id)

    def latest_completed(self, *, include_discarded: bool = False) -> CheckpointInfo | None:
        """The newest completed (or, if asked, discarded) checkpoint."""
        with self.store.read() as rows:
            return rows.latest_completed(include_discarded=include_discarded)

    def pending_for(self, stage_id: str) -> list[int]:
        """Pending checkpoints still waiting for this stage's acknowledgement."""
        with self.store.read() as rows:
            return rows.awaiting(stage_id)

    def transactions(self, stage_id: str | None = None) -> list[tuple[SinkTransaction, str]]:
        """All recorded transactions with their state (for inspection and tests)."""
        with self.store.read() as rows:
            return rows.transactions(stage_id)
